// Benchmark: how the data path's worker stages scale with their workers, each
// stage alone in one process (issue 38's scaling lines). One JSON object per
// line.
//
//   stage_scaling [--size SIZE] [--workers 1,2] [--runs N (5)] [--data bf16|noise]
//
// source_workers: the source's ChunkPipeline (engine/session/chunk_pipeline.h)
//   reading a sim device, splitting its pages into zero and data runs and
//   hashing them on W workers, into a consumer that takes each 1 MiB chunk in
//   order and drops it: the discarding sink (no session thread's framing, no
//   sealing, no socket: those are the stages after it).
// destination_workers: a FrameReceiver (engine/session/frame_receiver.h) with
//   W workers (0: the stream's thread does it all) reading one stream that
//   replays, from memory, frames recorded from the same sim's bytes: 1 MiB
//   AES-256-GCM frames written by the engine's FrameSender (the recorded
//   stream). Each frame is opened and its pages written into a buffer with
//   their page hash, as the destination applies them.
// Each line: raw bytes per second (median of --runs, the worker counts
// measured in turn), its ratio to the same stage's one-worker line
// (`vs_one_worker`), the process's CPU seconds per GB, and the cores. On a host whose cores are all busy with
// one worker the ratio cannot pass what the cores allow: the line says the
// cores so a reader can tell.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/session/chunk_pipeline.h"
#include "engine/session/frame_receiver.h"
#include "engine/session/frame_sender.h"
#include "engine/session/mailbox.h"
#include "engine/session/page_hashes.h"
#include "gpumigrate/common/clock.h"
#include "gpumigrate/common/units.h"
#include "gpumigrate/devices/sim.h"

using namespace gpumigrate;
using session_detail::ChunkJob;
using session_detail::ChunkPipeline;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kChunk = 1 << 20;

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

struct Measured {
  double bytes_per_s = 0;
  double cpu_s = 0;
};

// The whole device in 1 MiB chunks through W reading workers, dropped in order.
Measured SourceStage(Device& dev, uint32_t workers) {
  ChunkPipeline pipe(dev, workers);
  std::vector<ChunkJob> jobs;
  const auto regions = dev.Regions();
  for (size_t r = 0; r < regions.size(); ++r) {
    const uint64_t per = kChunk / regions[r].page_size;
    for (uint64_t p = 0; p < regions[r].pages(); p += per) {
      ChunkJob j;
      j.region = r;
      j.region_id = regions[r].id;
      j.first_page = p;
      j.pages = std::min(per, regions[r].pages() - p);
      j.offset = p * regions[r].page_size;
      j.length = std::min(j.pages * regions[r].page_size, regions[r].size_bytes - j.offset);
      j.page_size = regions[r].page_size;
      jobs.push_back(j);
    }
  }
  uint64_t bytes = 0;
  auto take = [&] {
    auto& c = pipe.Front();
    if (!c.read.ok()) {
      fmt::print(stderr, "read failed: {}\n", c.read.ToString());
      std::exit(1);
    }
    bytes += c.job.length;
    pipe.PopFront();
  };
  const double cpu0 = CpuSeconds();
  const auto t0 = SteadyClock::now();
  for (const auto& j : jobs) {
    while (!pipe.HasRoom(j.length)) take();
    pipe.Submit(j);
  }
  while (pipe.in_flight() > 0) take();
  const double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  return {static_cast<double>(bytes) / secs, CpuSeconds() - cpu0};
}

// Collects what a FrameSender writes (the recording).
class RecordingStream final : public Stream {
 public:
  std::string Name() const override { return "recording"; }
  Status WriteAll(std::span<const std::byte> data) override {
    std::lock_guard lk(mu_);
    bytes_.insert(bytes_.end(), data.begin(), data.end());
    return Status::Ok();
  }
  Status ReadExact(std::span<std::byte>) override { return Unimplemented("recording: write only"); }
  void Close() override {}
  std::vector<std::byte> Take() { return std::move(bytes_); }

 private:
  std::mutex mu_;
  std::vector<std::byte> bytes_;
};

// Replays a recording (one reader), then waits, as an idle socket does, until
// it is closed.
class ReplayStream final : public Stream {
 public:
  explicit ReplayStream(std::span<const std::byte> bytes) : bytes_(bytes) {}
  std::string Name() const override { return "recorded stream"; }
  Status WriteAll(std::span<const std::byte>) override { return Unimplemented("recorded stream: read only"); }
  Status ReadExact(std::span<std::byte> out) override {
    if (pos_ + out.size() > bytes_.size()) return AwaitClose();
    std::memcpy(out.data(), bytes_.data() + pos_, out.size());
    pos_ += out.size();
    return Status::Ok();
  }
  Result<size_t> ReadSome(std::span<std::byte> out) override {
    if (pos_ == bytes_.size()) return AwaitClose();
    const size_t n = std::min(out.size(), bytes_.size() - pos_);
    std::memcpy(out.data(), bytes_.data() + pos_, n);
    pos_ += n;
    return n;
  }
  void Close() override {
    {
      std::lock_guard lk(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }

 private:
  Status AwaitClose() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return closed_; });
    return Unavailable("recorded stream: closed");
  }

  std::span<const std::byte> bytes_;
  size_t pos_ = 0;  // the reader's
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
};

FrameKeys BenchKeys() {
  FrameKeys k;
  k.aes_gcm = true;
  for (size_t i = 0; i < k.aes_key.size(); ++i) k.aes_key[i] = static_cast<std::byte>(i * 11 + 3);
  return k;
}

// The device's bytes as one region of AES-256-GCM frames of at most 1 MiB (a
// device region's last may be shorter) on one stream; *frames: how many.
std::vector<std::byte> Record(Device& dev, uint64_t size, uint64_t* frames) {
  RecordingStream rec;
  FakeClock clock;
  FrameSender sender({&rec}, BenchKeys(), 0, clock);
  std::vector<std::byte> buf(kChunk);
  uint64_t at = 0;
  for (const auto& r : dev.Regions()) {
    for (uint64_t off = 0; off < r.size_bytes; off += kChunk) {
      const uint64_t n = std::min(kChunk, r.size_bytes - off);
      std::span<std::byte> part(buf.data(), n);
      if (!dev.Read(r.id, off, part).ok()) std::exit(1);
      if (!sender.Send(wire::FrameType::kPages, 1, 0, at, static_cast<uint32_t>(n), part).ok()) std::exit(1);
      at += n;
      ++*frames;
    }
  }
  if (at != size || !sender.Flush().ok()) std::exit(1);
  return rec.Take();
}

// One replay of the recording into W workers (0: the stream's thread alone).
Measured DestinationStage(std::span<const std::byte> recording, uint64_t size, uint64_t frames, uint32_t workers) {
  std::vector<RegionInfo> regions{{1, "device", size, 4096, RegionHint::kUnknown}};
  std::vector<std::byte> dst(size);
  std::vector<uint64_t> hashes(size / 4096 + 1);
  Mailbox box(SystemClock());
  ReplayStream in(recording);
  FrameReceiver rx(
      {&in}, BenchKeys(), kChunk, &regions,
      [&](const wire::FrameHeader& h, std::span<const std::byte> raw) {
        std::memcpy(dst.data() + h.offset, raw.data(), raw.size());
        for (uint64_t p = 0; p < raw.size(); p += 4096) {
          hashes[(h.offset + p) / 4096] = HashPage(raw.subspan(p, std::min<uint64_t>(4096, raw.size() - p)));
        }
        return Status::Ok();
      },
      &box, workers);
  const double cpu0 = CpuSeconds();
  const auto t0 = SteadyClock::now();
  rx.Start();
  while (rx.frames_total() < frames && box.failure().ok()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  const double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  const double cpu = CpuSeconds() - cpu0;
  rx.StopQuietly();
  in.Close();
  rx.Join();
  if (!box.failure().ok()) {
    fmt::print(stderr, "replay failed: {}\n", box.failure().ToString());
    std::exit(1);
  }
  return {static_cast<double>(size) / secs, cpu};
}

void Emit(const char* stage, const std::string& data, uint64_t size, uint32_t workers, const Measured& m,
          double one_worker) {
  nlohmann::ordered_json j{{"benchmark", "stage_scaling"}, {"stage", stage},   {"data", data},
                           {"bytes", size},                {"workers", workers}, {"raw_bytes_per_s", std::llround(m.bytes_per_s)}};
  if (one_worker > 0) j["vs_one_worker"] = std::round(m.bytes_per_s / one_worker * 1000) / 1000;
  j["cpu_s_per_gb"] = std::round(m.cpu_s * 1e9 / static_cast<double>(size) * 1000) / 1000;
  j["cores"] = std::thread::hardware_concurrency();
  fmt::print("{}\n", j.dump());
  std::fflush(stdout);
}

// Each worker count measured `runs` times, the counts alternating (so a slow
// spell of a shared host falls on all of them), then each count's median.
template <typename F>
void MeasureAll(const char* stage, const std::string& data, uint64_t size, const std::vector<uint32_t>& counts,
                int runs, F measure) {
  std::vector<std::vector<Measured>> got(counts.size());
  for (int r = 0; r < runs; ++r) {
    for (size_t i = 0; i < counts.size(); ++i) got[i].push_back(measure(counts[i]));
  }
  std::vector<Measured> median;
  double one_worker = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    auto& all = got[i];
    std::sort(all.begin(), all.end(), [](const Measured& a, const Measured& b) { return a.bytes_per_s < b.bytes_per_s; });
    median.push_back(all[all.size() / 2]);
    if (counts[i] == 1) one_worker = median.back().bytes_per_s;
  }
  for (size_t i = 0; i < counts.size(); ++i) Emit(stage, data, size, counts[i], median[i], one_worker);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size = 512ull << 20;
  std::vector<uint32_t> counts{1, 2};
  int runs = 5;
  std::string data = "bf16";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--size") {
      size = *ParseSize(v);
    } else if (k == "--runs") {
      runs = std::max(1, std::stoi(v));
    } else if (k == "--data") {
      data = v;
    } else if (k == "--workers") {
      counts.clear();
      for (size_t at = 0; at <= v.size();) {
        size_t comma = v.find(',', at);
        if (comma == std::string::npos) comma = v.size();
        counts.push_back(static_cast<uint32_t>(std::stoul(v.substr(at, comma - at))));
        at = comma + 1;
      }
    } else {
      fmt::print(stderr, "usage: stage_scaling [--size SIZE] [--workers 1,2] [--runs N] [--data bf16|noise]\n");
      return 2;
    }
  }
  auto spec = ParseSimSpec(fmt::format("sim:size={},static=0.98,kv=0.01,kv_fill=1,kv_rate=0,hot=64KiB{}", size,
                                       data == "noise" ? ",data=noise" : ""));
  if (!spec.ok()) {
    fmt::print(stderr, "{}\n", spec.status().ToString());
    return 2;
  }
  auto dev = SimDevice::Create(*spec, SimRole::kSource);
  if (!dev.ok()) {
    fmt::print(stderr, "{}\n", dev.status().ToString());
    return 1;
  }
  uint64_t total = 0;
  for (const auto& r : (*dev)->Regions()) total += r.size_bytes;
  (void)SourceStage(**dev, 1);  // warm-up: first reads pay page faults
  std::vector<uint32_t> source_counts;
  for (uint32_t w : counts) {
    if (w > 0) source_counts.push_back(w);  // the source needs a worker
  }
  MeasureAll("source_workers", data, total, source_counts, runs, [&](uint32_t w) { return SourceStage(**dev, w); });
  uint64_t frames = 0;
  const std::vector<std::byte> recording = Record(**dev, total, &frames);
  MeasureAll("destination_workers", data, total, counts, runs,
             [&](uint32_t w) { return DestinationStage(recording, total, frames, w); });
  return 0;
}
