// Replayer: the near end of a restore's session. It plays the source's part of
// the migration protocol from a chain of checkpoint files (the root first):
// Hello, the root's Manifest, then every file's frames and RoundEnds in file
// order, so the destination session applies and checks them exactly as it
// would a live migration's. Each file's footer is checked against what was
// read, and each file against the base it names; only then does the last
// file's Prepare go out (the destination verifies every digest and the device
// state) followed by Commit. Any fault found here is sent as Abort and ends the
// restore; the destination discards what it applied.
//
// A file taken with a content store (checkpoint --content-store) holds
// PAGE_DIGESTS frames, each followed by the recorder's ContentAnswer: the
// destination (given the store) fills the pages and answers in turn, and any
// page it could not fill that the recorder did fill is an error naming it,
// since the file does not hold its bytes.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <tuple>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint.pb.h"
#include "engine/checkpoint/file_reader.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"

namespace gpumigrate::ckpt {

class Replayer {
 public:
  // `chain` root first; all files of one chain (ReadChain checks that).
  using ProgressFn = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;
  Replayer(std::vector<std::unique_ptr<FileReader>>* chain, const SessionStreams& streams, ProgressFn progress = {})
      : chain_(chain), streams_(streams), progress_(std::move(progress)) {}
  ~Replayer() { (void)Join(); }

  void Start() {
    reader_ = std::thread([this] { ReadControl(); });
    thread_ = std::thread([this] { failure_ = Run(); });
  }
  Status Join() {
    if (thread_.joinable()) thread_.join();
    if (reader_.joinable()) reader_.join();
    return failure_;
  }

  // After Join: the last file's footer and page index (per region, per page).
  const wire::v1::CheckpointFooter& footer() const { return footer_; }
  const std::vector<std::vector<uint64_t>>& page_hashes() const { return page_hashes_; }
  // Where frame `seq` of data stream `stream` lies ("PATH: record N at byte O"),
  // for errors the destination finds in it; empty when unknown.
  std::string FrameWhere(size_t stream, uint64_t seq) const;

 private:
  Status Run();
  Status Replay();
  // The destination's messages are read as they come (its content answers may
  // outnumber what the control stream buffers while frames are still being
  // written) and taken in order by Next.
  void ReadControl();
  Result<wire::v1::Envelope> Next();
  // What one file's pass has read so far.
  struct FilePass {
    FileReader& f;
    size_t index;
    bool last;
    uint64_t frames = 0, records = 1;  // the manifest was record 0
    bool have_prepare = false;
    wire::v1::Envelope prepare;
    std::vector<std::vector<uint64_t>> hashes;  // last file: its page index, per region
  };
  Status File(size_t index, bool last, wire::v1::Envelope* prepare);
  Status OnFrame(FilePass& fp, const Record& rec);
  Status OnControl(FilePass& fp, const Record& rec);
  Status OnIndex(FilePass& fp, const Record& rec);
  Status OnFooter(FilePass& fp, const Record& rec, wire::v1::Envelope* prepare);
  Status TakeIndex(FilePass& fp, const Record& rec);
  Status CheckNextBase(const FilePass& fp, const Record& rec, const wire::v1::CheckpointFooter& footer) const;
  Status Bad(const FilePass& fp, const Record& rec, const std::string& why) const;
  Status Await(wire::v1::Envelope::MsgCase want, const char* what, wire::v1::Envelope* got = nullptr);
  // The destination's answers to the round's PAGE_DIGESTS frames, then its RoundApplied.
  Status AwaitRoundApplied(const FilePass& fp, const Record& rec);
  Status CheckAnswer(const FilePass& fp, const Record& rec, const wire::v1::ContentAnswer& got);

  std::vector<std::unique_ptr<FileReader>>* chain_;
  SessionStreams streams_;
  ProgressFn progress_;
  uint64_t done_bytes_ = 0, total_bytes_ = 0, reported_ = 0;
  std::thread thread_, reader_;
  Status failure_;
  std::mutex in_mu_;
  std::condition_variable in_cv_;
  std::deque<wire::v1::Envelope> inbox_;
  Status in_status_;  // why the control stream ended (set once it has)
  bool in_done_ = false;
  wire::v1::CheckpointFooter footer_;
  std::vector<std::vector<uint64_t>> page_hashes_;
  struct Where {
    uint32_t file;
    uint64_t number, offset;
  };
  std::vector<std::vector<Where>> frames_;  // per stream, by sequence
  // The recorder's ContentAnswers not yet matched by the destination's: by
  // (round, region, first page), the pages it left missed.
  std::map<std::tuple<uint32_t, uint32_t, uint64_t>, std::vector<uint32_t>> recorded_answers_;
  bool destination_has_store_ = false;
};

}  // namespace gpumigrate::ckpt
