// ChunkPipeline: the source's reading workers (issue 38). The session thread
// submits chunks (a run of pages of one region, at most one frame's payload) in
// the order it will send them; worker threads read each from the device, split
// its pages into zero and data runs and hash them (PageClassifier), keep the
// parts the destination does not hold, and, where asked, encode the data parts
// with the region's codec or compute their pages' SHA-256 for the content
// offer. The session thread takes the results back in
// submission order (Front, then PopFront) and does what must stay in order:
// content offers, numbering and queueing frames, the page-hash record, the
// dirty set, progress and the link's judgement.
//
// Memory is bounded whatever the device size: at most depth() chunks of more
// than kSmallChunkBytes are submitted and not yet popped, each holding its raw
// bytes and encoded parts, and beside them at most kSmallPerWorker small ones
// per worker (scattered dirty pages: a final round of 4 KiB runs), kept in a
// pool of their own so a small chunk never holds a large chunk's buffers. The
// many small chunks in flight keep the workers and the session thread from
// waking each other for every page.
// A device whose Read is not safe from several threads at once
// (Device::ConcurrentReads false) is read by one worker at a time; the other
// stages still run on every worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "engine/session/page_classifier.h"
#include "gpumigrate/codec/codec.h"
#include "gpumigrate/content/content_store.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::session_detail {

struct ChunkJob {
  size_t region = 0;      // index in the session's regions
  uint32_t region_id = 0;
  uint64_t first_page = 0, pages = 0;
  uint64_t offset = 0, length = 0;  // bytes within the region (the last page may be short)
  uint64_t page_size = 0;
  // The destination's hash of each of these pages, when only the pages it does
  // not hold go (round 0 of a session that continues, or after a resumption);
  // empty: every page goes. Read by a worker while the session thread records
  // other pages' hashes: the two never touch the same page.
  std::span<const uint64_t> held;
  CodecKind codec = CodecKind::kNone;  // kNone: the session thread encodes (or sends raw)
  int level = 0;
  // The content offer may take this chunk's data runs: the worker computes
  // each data page's SHA-256 (Chunk::digests), so the session thread does not.
  bool digest = false;
};

struct Chunk {
  ChunkJob job;
  Status read;  // the device read's outcome; nothing below is set when it failed
  double read_ms = 0;
  std::vector<std::byte> raw;
  std::vector<uint64_t> hashes;  // per page of the chunk
  // The runs to send, in order (zero runs and data runs the destination does
  // not hold), and for each data run its encoding when the job asked for one
  // (used kNone: send `raw`'s bytes).
  std::vector<PageRun> parts;
  std::vector<CodecKind> used;
  std::vector<std::vector<std::byte>> encoded;
  // When the job asked for digests: 32 bytes per page of the chunk, set for
  // the pages of its data parts (zero pages and pages held already are not
  // hashed), and the time the worker spent on them.
  std::vector<std::byte> digests;
  double digest_ms = 0;
  uint64_t same_zero = 0, same_known = 0;  // pages not sent: zero or held already
  // Pages of this chunk that a dirty sync marked again while it was in flight:
  // they stay in the dirty set when it is sent (set by the session thread).
  std::vector<uint64_t> keep;
  bool ready = false;  // the worker is done with it (under the pipeline's lock)
};

class ChunkPipeline {
 public:
  ChunkPipeline(Device& dev, uint32_t workers);
  ~ChunkPipeline();
  ChunkPipeline(const ChunkPipeline&) = delete;
  ChunkPipeline& operator=(const ChunkPipeline&) = delete;

  static constexpr uint64_t kSmallChunkBytes = 64 << 10;
  static constexpr size_t kSmallPerWorker = 32;

  uint32_t workers() const { return static_cast<uint32_t>(threads_.size()); }
  size_t depth() const { return depth_; }  // chunks over kSmallChunkBytes in flight, at most
  size_t in_flight() const { return chunks_.size(); }  // session thread
  // Whether a job of `length` bytes may be submitted now (session thread).
  bool HasRoom(uint64_t length) const {
    return length > kSmallChunkBytes ? large_in_flight_ < depth_ : small_in_flight_ < small_depth_;
  }

  void Submit(const ChunkJob& job);  // HasRoom(job.length)
  // The oldest submitted chunk, once its worker is done with it.
  Chunk& Front();
  void PopFront();
  // Drops every chunk in flight (after their workers are done with them).
  void Clear();
  // The chunks in flight, oldest first: a dirty sync marks their pages to keep.
  std::deque<std::unique_ptr<Chunk>>& chunks() { return chunks_; }

 private:
  void Run();
  void Prepare(Chunk& c, PageClassifier& pages, FrameEncoder& encoder, Sha256Hasher& sha);

  Device& dev_;
  const bool concurrent_reads_;
  size_t depth_ = 0, small_depth_ = 0;
  size_t large_in_flight_ = 0, small_in_flight_ = 0;  // session thread
  std::deque<std::unique_ptr<Chunk>> chunks_;  // session thread: submitted, not popped
  // Popped chunks, their buffers kept for reuse: small jobs' and large jobs' apart.
  std::vector<std::unique_ptr<Chunk>> spare_, spare_small_;

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Chunk*> todo_;  // under mu_
  bool stop_ = false;
  std::mutex read_mu_;  // held around Read when the device does not take concurrent reads
  std::vector<std::thread> threads_;
};

// Workers for a session: `requested` when set, else this host's cores (at most 8).
uint32_t SourceWorkers(uint32_t requested);

}  // namespace gpumigrate::session_detail
