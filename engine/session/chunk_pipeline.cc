#include "engine/session/chunk_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "gpumigrate/session/session.h"

namespace gpumigrate::session_detail {

uint32_t SourceWorkers(uint32_t requested) {
  if (requested > 0) return requested;
  return DefaultSourceWorkers(std::thread::hardware_concurrency());
}

ChunkPipeline::ChunkPipeline(Device& dev, uint32_t workers)
    : dev_(dev), concurrent_reads_(dev.ConcurrentReads()) {
  workers = std::max<uint32_t>(1, workers);
  // Two chunks per worker: one being prepared, one ready while the session
  // thread sends the one before.
  depth_ = 2 * static_cast<size_t>(workers);
  small_depth_ = kSmallPerWorker * static_cast<size_t>(workers);
  for (uint32_t w = 0; w < workers; ++w) threads_.emplace_back([this] { Run(); });
}

ChunkPipeline::~ChunkPipeline() {
  Clear();
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ChunkPipeline::Submit(const ChunkJob& job) {
  const bool small = job.length <= kSmallChunkBytes;
  (small ? small_in_flight_ : large_in_flight_)++;
  auto& pool = small ? spare_small_ : spare_;
  std::unique_ptr<Chunk> c;
  if (!pool.empty()) {
    c = std::move(pool.back());
    pool.pop_back();
  } else {
    c = std::make_unique<Chunk>();
  }
  c->job = job;
  c->ready = false;
  c->keep.clear();  // the session thread's alone (MergeWritten), never a worker's
  Chunk* raw = c.get();
  chunks_.push_back(std::move(c));
  {
    std::lock_guard lk(mu_);
    todo_.push_back(raw);
  }
  work_cv_.notify_one();
}

Chunk& ChunkPipeline::Front() {
  Chunk* c = chunks_.front().get();
  std::unique_lock lk(mu_);
  done_cv_.wait(lk, [&] { return c->ready; });
  return *c;
}

void ChunkPipeline::PopFront() {
  const bool small = chunks_.front()->job.length <= kSmallChunkBytes;
  (small ? small_in_flight_ : large_in_flight_)--;
  (small ? spare_small_ : spare_).push_back(std::move(chunks_.front()));
  chunks_.pop_front();
}

void ChunkPipeline::Clear() {
  {
    // Chunks no worker has taken yet are simply dropped.
    std::lock_guard lk(mu_);
    for (Chunk* c : todo_) c->ready = true;
    todo_.clear();
  }
  while (!chunks_.empty()) {
    Front();
    PopFront();
  }
}

void ChunkPipeline::Run() {
  PageClassifier pages;
  FrameEncoder encoder;
  Sha256Hasher sha;
  std::unique_lock lk(mu_);
  while (true) {
    work_cv_.wait(lk, [&] { return stop_ || !todo_.empty(); });
    if (todo_.empty()) return;
    Chunk* c = todo_.front();
    todo_.pop_front();
    lk.unlock();
    Prepare(*c, pages, encoder, sha);
    lk.lock();
    c->ready = true;
    done_cv_.notify_all();
  }
}

void ChunkPipeline::Prepare(Chunk& c, PageClassifier& pages, FrameEncoder& encoder, Sha256Hasher& sha) {
  const ChunkJob& j = c.job;
  c.raw.resize(j.length);
  c.parts.clear();
  c.used.clear();
  c.same_zero = c.same_known = 0;
  c.digest_ms = 0;
  const auto t = std::chrono::steady_clock::now();
  if (concurrent_reads_) {
    c.read = dev_.Read(j.region_id, j.offset, c.raw);
  } else {
    std::lock_guard lk(read_mu_);
    c.read = dev_.Read(j.region_id, j.offset, c.raw);
  }
  c.read_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  if (!c.read.ok()) return;
  pages.Classify(c.raw, j.page_size);
  c.hashes = pages.hashes();
  for (const PageRun& whole : pages.runs()) {
    if (j.held.empty()) {
      c.parts.push_back(whole);
    } else {
      const uint64_t same = AppendUnknownParts(whole, pages.hashes(), j.held, j.page_size, c.parts);
      (whole.zero ? c.same_zero : c.same_known) += same;
    }
  }
  if (c.encoded.size() < c.parts.size()) c.encoded.resize(c.parts.size());
  for (size_t k = 0; k < c.parts.size(); ++k) {
    const PageRun& run = c.parts[k];
    CodecKind used = CodecKind::kNone;
    if (!run.zero && j.codec != CodecKind::kNone) {
      used = encoder.Encode(j.codec, j.level, std::span<const std::byte>(c.raw).subspan(run.offset_bytes, run.length_bytes),
                            c.encoded[k]);
    }
    c.used.push_back(used);
  }
  if (!j.digest) return;
  const auto d0 = std::chrono::steady_clock::now();
  c.digests.resize(j.pages * 32);
  for (const PageRun& run : c.parts) {
    if (run.zero) continue;
    for (uint64_t k = 0; k < run.pages; ++k) {
      const uint64_t at = run.offset_bytes + k * j.page_size;
      const ContentDigest d = sha.Digest(std::span<const std::byte>(c.raw).subspan(at, std::min(j.page_size, j.length - at)));
      std::memcpy(c.digests.data() + (run.first_page + k) * 32, d.data(), 32);
    }
  }
  c.digest_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count();
}

}  // namespace gpumigrate::session_detail

namespace gpumigrate {

uint32_t DefaultSourceWorkers(uint32_t cores) { return std::clamp<uint32_t>(cores == 0 ? 1 : cores, 1, 8); }

}  // namespace gpumigrate
