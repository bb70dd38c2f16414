// A running migration's rate cap, read from a file another process writes: the
// agent paces the migrations it runs for an evacuation's controller by writing
// each one's share of the link there (atomically: write, then rename).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

class RateFile {
 public:
  // Reads `path` now (it must hold a rate: "12.5MB/s", "100Mbit", or "0" for
  // unlimited) and then every `period` on a thread of its own. A later read
  // that fails (the file being replaced, or not a rate) keeps the rate it had.
  static Result<std::unique_ptr<RateFile>> Open(const std::string& path,
                                                std::chrono::milliseconds period = std::chrono::milliseconds(20));
  ~RateFile();

  // Bytes/s, 0: unlimited; for SourceOptions::bandwidth_now.
  const std::atomic<double>* rate() const { return &rate_; }
  // How many times the rate has changed since Open.
  uint64_t changes() const { return changes_.load(); }

 private:
  RateFile(std::string path, std::chrono::milliseconds period) : path_(std::move(path)), period_(period) {}
  void Run();

  const std::string path_;
  const std::chrono::milliseconds period_;
  std::atomic<double> rate_{0};
  std::atomic<uint64_t> changes_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// What a rate file holds ("0": unlimited); the error names the file.
Result<double> ReadRateFile(const std::string& path);
// Writes `text` to `path` so that a reader sees the old rate or the new, never half.
Status WriteRateFile(const std::string& path, const std::string& text);
// The same for any small file another process polls (a migration's phase).
Status ReplaceFile(const std::string& path, const std::string& text);

}  // namespace gpumigrate
