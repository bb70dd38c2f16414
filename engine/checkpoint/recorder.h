// Recorder: the far end of a checkpoint's session. It answers the migration
// protocol as a destination would (Hello, Ready, RoundApplied, Prepared,
// Running) and appends what the source sends to the file: the manifest first,
// each data frame verbatim as it arrives, each RoundEnd and the Prepare once
// their frames are in, then the page index and the footer. Prepared is answered
// only after the file is complete, fsync'd and renamed: the source stops
// holding its device for nothing less. A failure (the disk is full, the source
// aborted) answers Abort where it can and removes the partial file; the source
// then rolls back as from any destination failure.
//
// With a content store (checkpoint --content-store) the recorder says so in
// its Hello, as a destination with one does: the source then offers pre-copy
// pages by SHA-256. A PAGE_DIGESTS frame is recorded verbatim, followed by the
// ContentAnswer the recorder gave (a control record): the pages the store
// could be read for, their digest checked, stay out of the file; the others
// it names as missed, and the source sends them in a later round.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "checkpoint.pb.h"
#include "engine/checkpoint/file_format.h"
#include "engine/checkpoint/file_sink.h"
#include "engine/session/content_fill.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"

namespace gpumigrate::ckpt {

class Recorder {
 public:
  // `first_frames`: an incremental checkpoint's session numbers frames on from
  // its base's (per stream); empty: from 0. `manifest` is record 0 without its session part (the recorder adds the
  // session's Manifest when it arrives). `page_hashes` is filled by the
  // session's before_prepare hook before Prepare is sent. Borrowed pointers
  // outlive the recorder.
  Recorder(FileSink* sink, const FileHeader& header, const FileKeys& keys, wire::v1::CheckpointManifest manifest,
           const SessionStreams& streams, const std::vector<std::vector<uint64_t>>* page_hashes,
           std::vector<uint64_t> first_frames = {}, ContentFill* content = nullptr);
  ~Recorder();

  void Start();
  // Waits for the recorder to finish; its outcome: Ok once the file was
  // committed, else why it was not.
  Status Join();

  uint64_t records() const { return next_record_; }

 private:
  void RunControl();
  void RunData(size_t s);
  Status Control();
  Status OnManifest(const wire::v1::Manifest& m);
  Status WaitForFrames(const google::protobuf::RepeatedField<uint64_t>& counts);
  Status WriteSealed(RecordKind kind, const google::protobuf::Message& msg);
  Status WriteFrame(std::span<const std::byte> frame);
  Status WriteSealedLocked(RecordKind kind, const google::protobuf::Message& msg);
  // A PAGE_DIGESTS frame: which of its pages the store fills, the frame and
  // the answer recorded, the answer sent (before the frame counts).
  Status RecordDigests(size_t s, const wire::FrameHeader& h, std::span<const std::byte> frame,
                       FrameProtector& protector);
  Status Finish(const wire::v1::Prepare& p);
  void Fail(Status st);
  Status Failure();
  // Control messages go out one at a time from either thread.
  Status Send(const wire::v1::Envelope& env);
  // Tells the source why the file cannot be written (once), so it rolls back
  // with that reason rather than a broken stream's.
  void AbortSession(const Status& why);

  FileSink* sink_;
  FileHeader header_;
  RecordSealer sealer_;
  wire::v1::CheckpointManifest manifest_;
  SessionStreams streams_;
  const std::vector<std::vector<uint64_t>>* page_hashes_;
  ContentFill* content_;
  FrameKeys frame_keys_;
  uint32_t max_payload_ = 0;

  std::mutex mu_;  // the sink, the record numbers, the counts, the failure
  std::condition_variable cv_;
  uint64_t next_record_ = 0;
  uint64_t frames_total_ = 0;
  std::vector<uint64_t> frames_;  // per stream: the session's count (this file's frames and its base's)
  Status failure_;
  bool committed_ = false;
  bool data_started_ = false;
  std::mutex send_mu_;
  bool abort_sent_ = false;
  std::thread control_;
  std::vector<std::thread> data_;
};

}  // namespace gpumigrate::ckpt
