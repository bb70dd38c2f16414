// The simulated GPU: storage (versions on the source, bytes on the destination),
// lifecycle, device state, dirty tracking and the LLM-inference workload thread.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "engine/devices/sim/content.h"
#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/sim.h"

namespace gpumigrate {
namespace {

using sim::ContentKind;

constexpr uint32_t kWeights = 0, kKv = 1, kAct = 2, kFree = 3;
constexpr char kStateMagic[8] = {'G', 'M', 'S', 'I', 'M', 'S', 'T', '1'};

// Faults a fresh mapping in (zero-filled) by writing one byte per 4 KiB page.
// Measured here: three times faster than MADV_POPULATE_WRITE, which does not
// seem to take the huge-page path.
void Prefault(std::byte* mem, uint64_t bytes) {
  for (uint64_t off = 0; off < bytes; off += 4096) reinterpret_cast<volatile char*>(mem)[off] = 0;
}

struct SimRegion {
  RegionInfo info;
  ContentKind kind = ContentKind::kZero;
  std::unique_ptr<std::atomic<uint32_t>[]> versions;  // source role
  std::byte* mem = nullptr;                           // destination role
  std::unique_ptr<AtomicDirtyBitmap> dirty;
};

// Serialized device state: the workload's position plus the geometry it belongs to.
struct StateBlob {
  char magic[8];
  uint32_t format;
  uint32_t page_size;
  uint64_t seed;
  uint64_t region_bytes[4];
  uint64_t step;
  uint32_t layer;
  uint32_t layers;
  uint64_t kv_cursor;
  uint64_t step_period_us;
  double kv_rate;
};
static_assert(sizeof(StateBlob) == 96);

class SimDeviceImpl;

class SimTracker final : public DirtyTracker {
 public:
  explicit SimTracker(SimDeviceImpl* dev) : dev_(dev) {}
  std::string Name() const override { return "sim-bitmap"; }
  Status Start() override;
  Status Sync(uint32_t region, DirtyBitmap& out) override;
  Status Stop() override { return Status::Ok(); }

 private:
  SimDeviceImpl* dev_;
};

class SimDeviceImpl final : public SimDevice {
 public:
  SimDeviceImpl(const SimSpec& spec, SimRole role, Clock& clock)
      : spec_(spec), clock_(clock), role_(role), tracker_(this) {}
  ~SimDeviceImpl() override {
    {
      std::lock_guard lk(mu_);
      quit_ = true;
      cv_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
    for (auto& r : regions_) {
      if (r.mem) munmap(r.mem, r.info.size_bytes);
    }
  }

  Status Init() {
    sim::WarmContentTables();  // here, not in the first round's first read
    const uint64_t page = spec_.page_size;
    const uint64_t size = spec_.size_bytes / page * page;
    uint64_t weights = static_cast<uint64_t>(spec_.static_fraction * static_cast<double>(size)) / page * page;
    uint64_t hot = std::min((spec_.hot_bytes + page - 1) / page * page, size - weights);
    uint64_t kv = std::min(static_cast<uint64_t>(spec_.kv_fraction * static_cast<double>(size)) / page * page,
                           size - weights - hot);
    uint64_t free = size - weights - hot - kv;
    struct L { uint32_t id; const char* name; uint64_t bytes; RegionHint hint; ContentKind kind; };
    const ContentKind weights_kind = spec_.noise ? ContentKind::kNoise : ContentKind::kWeights;
    const ContentKind kv_kind = spec_.noise ? ContentKind::kNoise : ContentKind::kKvCache;
    const L layout[] = {{kWeights, "weights", weights, RegionHint::kStatic, weights_kind},
                        {kKv, "kv_cache", kv, RegionHint::kDynamic, kv_kind},
                        {kAct, "activations", hot, RegionHint::kDynamic, ContentKind::kActivations},
                        {kFree, "free_pool", free, RegionHint::kUnknown, ContentKind::kZero}};
    regions_.resize(4);
    for (const L& l : layout) {
      SimRegion& r = regions_[l.id];
      r.info = RegionInfo{l.id, l.name, l.bytes, spec_.page_size, l.hint};
      r.kind = l.kind;
      if (l.bytes == 0) continue;
      r.dirty = std::make_unique<AtomicDirtyBitmap>(r.info.pages());
      if (role_ == SimRole::kSource) {
        r.versions.reset(new std::atomic<uint32_t>[r.info.pages()]);
        for (uint64_t p = 0; p < r.info.pages(); ++p) r.versions[p].store(0, std::memory_order_relaxed);
      } else {
        void* m = mmap(nullptr, l.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return Status::FromErrno(errno, fmt::format("sim device: map {} bytes for region {}", l.bytes, l.name));
        r.mem = static_cast<std::byte*>(m);
        // A GPU's memory exists before data arrives; host memory standing in for it
        // is faulted in now, so migrations measure the transfer, not this VM's page
        // faults (about 0.25 GB/s with 4 KiB pages, 1.4 GB/s with huge pages here).
        (void)madvise(m, l.bytes, MADV_HUGEPAGE);
        Prefault(r.mem, l.bytes);
      }
      infos_.push_back(r.info);
    }
    if (role_ == SimRole::kSource) {
      // Model load: weights, the KV cache of requests already in flight, activations.
      SetVersionRange(kWeights, 0, regions_[kWeights].info.pages(), 1);
      uint64_t kv_filled = static_cast<uint64_t>(spec_.kv_fill * static_cast<double>(kv)) / page;
      SetVersionRange(kKv, 0, kv_filled, 1);
      SetVersionRange(kAct, 0, regions_[kAct].info.pages(), 1);
      pos_ = SimPosition{2, 0, kv_filled * page};
      state_ = DeviceState::kRunning;
      pause_ = false;
    } else {
      state_ = DeviceState::kStop;
      pause_ = true;
    }
    worker_ = std::thread([this] { WorkloadLoop(); });
    return Status::Ok();
  }

  // --- Device ---
  std::string Describe() const override { return spec_.ToString(); }
  const std::vector<RegionInfo>& Regions() const override { return infos_; }
  DeviceState State() const override { return state_.load(); }

  Status SetState(DeviceState next) override {
    std::lock_guard op(op_mu_);
    DeviceState cur = state_.load();
    if (cur == next) return Status::Ok();
    GM_RETURN_IF_ERROR(CheckTransition("sim device", role_, cur, next));
    if (role_ == SimRole::kSource) {
      if (next == DeviceState::kRunning) {
        ResumeWorkload();
      } else if (next == DeviceState::kStopCopy || next == DeviceState::kStop) {
        PauseWorkload();
      }
    } else {
      switch (next) {
        case DeviceState::kStop:
          if (cur == DeviceState::kResuming && !state_loaded_) {
            return FailedPrecondition("sim device: leave RESUMING failed: no device state was loaded");
          }
          if (cur == DeviceState::kRunning) PauseWorkload();
          break;
        case DeviceState::kRunning:
          if (!state_loaded_) return FailedPrecondition("sim device: resume failed: no device state was loaded");
          ResumeWorkload();
          break;
        case DeviceState::kError:
          // Discard: the destination forgets everything it received.
          PauseWorkload();
          for (auto& r : regions_) {
            if (r.mem) madvise(r.mem, r.info.size_bytes, MADV_DONTNEED);
          }
          state_loaded_ = false;
          break;
        default:
          break;
      }
    }
    state_ = next;
    return Status::Ok();
  }

  // Pages are generated from atomic versions (or copied from memory): any thread.
  bool ConcurrentReads() const override { return true; }

  Status Read(uint32_t region, uint64_t offset, std::span<std::byte> out) override {
    GM_ASSIGN_OR_RETURN(SimRegion * r, Check(region, offset, out.size(), "read"));
    if (r->mem) {
      std::memcpy(out.data(), r->mem + offset, out.size());
      return Status::Ok();
    }
    const uint64_t page = spec_.page_size;
    std::vector<std::byte> tmp;
    uint64_t done = 0;
    while (done < out.size()) {
      uint64_t pos = offset + done;
      uint64_t p = pos / page, in_page = pos % page;
      uint64_t n = std::min<uint64_t>(page - in_page, out.size() - done);
      uint32_t v = r->versions[p].load(std::memory_order_acquire);
      if (in_page == 0 && n == page) {
        sim::FillPage(spec_.seed, region, p, v, r->kind, out.subspan(done, n));
      } else {
        tmp.resize(page);
        sim::FillPage(spec_.seed, region, p, v, r->kind, tmp);
        std::memcpy(out.data() + done, tmp.data() + in_page, n);
      }
      done += n;
    }
    return Status::Ok();
  }

  Status Write(uint32_t region, uint64_t offset, std::span<const std::byte> in) override {
    GM_ASSIGN_OR_RETURN(SimRegion * r, CheckWritable(region, offset, in.size()));
    std::memcpy(r->mem + offset, in.data(), in.size());
    return Status::Ok();
  }

  // A source's pages are computed from (seed, page, version), version 0 being a
  // zero page: every version goes to 0. A destination drops its memory
  // (private anonymous: it reads back as zeros). Only with the workload stopped.
  Status Scrub() override {
    std::lock_guard op(op_mu_);
    const DeviceState cur = state_.load();
    if (cur == DeviceState::kRunning || cur == DeviceState::kPreCopy) {
      return FailedPrecondition(fmt::format("sim device: scrub failed: the device is {}, its workload runs",
                                            DeviceStateName(cur)));
    }
    PauseWorkload();
    for (auto& r : regions_) {
      if (r.mem != nullptr) {
        if (madvise(r.mem, r.info.size_bytes, MADV_DONTNEED) != 0) std::memset(r.mem, 0, r.info.size_bytes);
      } else if (r.versions) {
        for (uint64_t p = 0; p < r.info.pages(); ++p) r.versions[p].store(0, std::memory_order_release);
      }
    }
    return Status::Ok();
  }

  Status WriteZeros(uint32_t region, uint64_t offset, uint64_t length) override {
    GM_ASSIGN_OR_RETURN(SimRegion * r, CheckWritable(region, offset, length));
    std::memset(r->mem + offset, 0, length);
    return Status::Ok();
  }

  Result<std::vector<std::byte>> SaveState() override {
    if (state_ != DeviceState::kStopCopy) {
      return FailedPrecondition(fmt::format("sim device: save state failed: device is {}, not STOP_COPY",
                                            DeviceStateName(state_)));
    }
    StateBlob b{};
    std::memcpy(b.magic, kStateMagic, 8);
    b.format = 1;
    FillGeometry(b);
    {
      std::lock_guard lk(mu_);
      b.step = pos_.step;
      b.layer = pos_.layer;
      b.kv_cursor = pos_.kv_cursor_bytes;
    }
    std::vector<std::byte> out(sizeof b);
    std::memcpy(out.data(), &b, sizeof b);
    return out;
  }

  Status LoadState(std::span<const std::byte> blob) override {
    if (state_ != DeviceState::kResuming) {
      return FailedPrecondition(fmt::format("sim device: load state failed: device is {}, not RESUMING",
                                            DeviceStateName(state_)));
    }
    if (blob.size() != sizeof(StateBlob)) {
      return Corrupt(fmt::format("sim device: load state failed: blob is {} bytes, expected {}", blob.size(),
                                 sizeof(StateBlob)));
    }
    StateBlob b;
    std::memcpy(&b, blob.data(), sizeof b);
    if (std::memcmp(b.magic, kStateMagic, 8) != 0 || b.format != 1) {
      return Corrupt("sim device: load state failed: bad magic or format version");
    }
    StateBlob mine{};
    FillGeometry(mine);
    if (b.page_size != mine.page_size || b.seed != mine.seed || b.layers != mine.layers ||
        std::memcmp(b.region_bytes, mine.region_bytes, sizeof b.region_bytes) != 0) {
      return InvalidArgument(fmt::format(
          "sim device: load state failed: source geometry (page {}, seed {}, layers {}) does not match this device "
          "(page {}, seed {}, layers {}) or its region sizes differ",
          b.page_size, b.seed, b.layers, mine.page_size, mine.seed, mine.layers));
    }
    if (b.layer >= b.layers || b.kv_cursor > b.region_bytes[kKv]) {
      return Corrupt("sim device: load state failed: workload position is out of range");
    }
    std::lock_guard lk(mu_);
    pos_ = SimPosition{b.step, b.layer, b.kv_cursor};
    state_loaded_ = true;
    return Status::Ok();
  }

  PendingBytes PendingEstimate() const override { return PendingBytes{sizeof(StateBlob)}; }
  DirtyTracker* Tracker() override { return &tracker_; }

  // --- SimDevice ---
  const SimSpec& spec() const override { return spec_; }
  SimRole role() const override { return role_; }
  SimPosition Position() const override {
    std::lock_guard lk(mu_);
    return pos_;
  }
  uint64_t KernelsRun() const override { return kernels_run_.load(); }

  Result<uint64_t> SelfCheck() override {
    DeviceState st = state_.load();
    if (st == DeviceState::kRunning || st == DeviceState::kPreCopy) {
      return FailedPrecondition("sim device: self-check failed: pause the workload first");
    }
    SimRegion& act = regions_[kAct];
    if (act.info.size_bytes == 0) return uint64_t{0};
    SimPosition pos = Position();
    const uint64_t n = act.info.pages();
    const uint64_t boundary = pos.layer * n / spec_.layers;
    std::vector<std::byte> page(spec_.page_size), expect(spec_.page_size);
    for (uint64_t p = 0; p < n; ++p) {
      uint64_t want = p < boundary ? pos.step : pos.step - 1;
      if (want < 2) want = 1;  // written at load, before the first step
      GM_RETURN_IF_ERROR(Read(kAct, p * spec_.page_size, page));
      sim::Canary c = sim::ReadCanary(page, kAct, p);
      sim::FillPage(spec_.seed, kAct, p, static_cast<uint32_t>(want), ContentKind::kActivations, expect);
      if (!c.matches_identity || c.version != want || page != expect) {
        return Corrupt(fmt::format(
            "sim device: self-check failed: activation page {} holds step {}{}, expected step {} (workload at step "
            "{} layer {})",
            p, c.version, c.matches_identity ? "" : " with a wrong identity", want, pos.step, pos.layer));
      }
    }
    return n;
  }

  std::vector<SimRegion>& regions() { return regions_; }

 private:
  Result<SimRegion*> Check(uint32_t region, uint64_t offset, uint64_t length, const char* what) {
    GM_RETURN_IF_ERROR(CheckRange("sim device", what, infos_, region, offset, length));
    return &regions_[region];  // infos_ holds the regions with size, each at its id
  }

  Result<SimRegion*> CheckWritable(uint32_t region, uint64_t offset, uint64_t length) {
    if (role_ != SimRole::kDestination || state_ != DeviceState::kResuming) {
      return FailedPrecondition(fmt::format("sim device: write failed: device is a {} in {}, writes need a "
                                            "destination in RESUMING",
                                            DeviceRoleName(role_),
                                            DeviceStateName(state_)));
    }
    return Check(region, offset, length, "write");
  }

  void FillGeometry(StateBlob& b) const {
    b.page_size = spec_.page_size;
    b.seed = spec_.seed;
    for (int i = 0; i < 4; ++i) b.region_bytes[i] = regions_[i].info.size_bytes;
    b.layers = spec_.layers;
    b.step_period_us = static_cast<uint64_t>(spec_.step_period.count());
    b.kv_rate = spec_.kv_rate_bytes_per_s;
  }

  void SetVersionRange(uint32_t region, uint64_t first, uint64_t count, uint32_t version) {
    SimRegion& r = regions_[region];
    for (uint64_t p = first; p < first + count && p < r.info.pages(); ++p) r.versions[p].store(version);
  }

  // A workload write: change the page, then mark it dirty (see bitmap.h for why
  // this order never loses a write).
  void WritePage(uint32_t region, uint64_t page, uint32_t version) {
    SimRegion& r = regions_[region];
    if (r.versions) {
      r.versions[page].store(version, std::memory_order_release);
    } else {
      const uint64_t ps = spec_.page_size;
      sim::FillPage(spec_.seed, region, page, version, r.kind, std::span(r.mem + page * ps, ps));
    }
    r.dirty->Mark(page);
  }

  // One kernel: layer `pos.layer` of decode step `pos.step`.
  void RunKernel(SimPosition& pos) {
    const uint32_t version = static_cast<uint32_t>(pos.step);
    const uint64_t L = spec_.layers;
    SimRegion& act = regions_[kAct];
    if (act.info.size_bytes) {
      uint64_t n = act.info.pages();
      for (uint64_t p = pos.layer * n / L; p < (pos.layer + 1) * n / L; ++p) WritePage(kAct, p, version);
    }
    SimRegion& kv = regions_[kKv];
    if (kv.info.size_bytes && spec_.kv_rate_bytes_per_s > 0) {
      double per_step = spec_.kv_rate_bytes_per_s * std::chrono::duration<double>(spec_.step_period).count();
      // Spread the step's bytes over its kernels without losing the remainder.
      uint64_t begin = static_cast<uint64_t>(per_step * pos.layer / L);
      uint64_t end = static_cast<uint64_t>(per_step * (pos.layer + 1) / L);
      uint64_t bytes = std::min(end - begin, kv.info.size_bytes);
      const uint64_t ps = spec_.page_size;
      while (bytes > 0) {
        uint64_t n = std::min(bytes, kv.info.size_bytes - pos.kv_cursor_bytes);
        for (uint64_t p = pos.kv_cursor_bytes / ps; p <= (pos.kv_cursor_bytes + n - 1) / ps; ++p) {
          WritePage(kKv, p, version);
        }
        pos.kv_cursor_bytes += n;
        bytes -= n;
        if (pos.kv_cursor_bytes == kv.info.size_bytes) pos.kv_cursor_bytes = 0;  // recycle the oldest blocks
      }
    }
  }

  void WorkloadLoop() {
    std::unique_lock lk(mu_);
    // Kernels are spread over the step like a GPU's, so a stop can land between
    // any two of them. After a pause or a lag the workload does not burst.
    const auto kernel_period = std::chrono::duration_cast<Clock::Duration>(spec_.step_period) / spec_.layers;
    Clock::TimePoint next_kernel = clock_.Now();
    while (true) {
      cv_.wait(lk, [&] { return quit_ || !pause_; });
      if (quit_) return;
      auto now = clock_.Now();
      if (now < next_kernel) {
        // Bounded by kPollInterval of real time: the clock may be a fake one.
        cv_.wait_for(lk, std::min<Clock::Duration>(next_kernel - now, kPollInterval), [&] { return quit_ || pause_; });
        continue;
      }
      next_kernel = std::max(next_kernel, now - kernel_period) + kernel_period;
      SimPosition pos = pos_;
      in_kernel_ = true;
      lk.unlock();
      RunKernel(pos);
      lk.lock();
      in_kernel_ = false;
      if (++pos.layer == spec_.layers) {
        pos.layer = 0;
        ++pos.step;
      }
      pos_ = pos;
      kernels_run_.fetch_add(1);
      cv_.notify_all();
    }
  }

  // Returns once no kernel is running; the workload stays between kernels.
  void PauseWorkload() {
    std::unique_lock lk(mu_);
    pause_ = true;
    cv_.notify_all();
    cv_.wait(lk, [&] { return !in_kernel_; });
  }

  void ResumeWorkload() {
    std::lock_guard lk(mu_);
    pause_ = false;
    cv_.notify_all();
  }

  friend class SimTracker;

  const SimSpec spec_;
  Clock& clock_;  // the workload's step timing
  const SimRole role_;
  std::vector<SimRegion> regions_;  // indexed by region id
  std::vector<RegionInfo> infos_;   // non-empty regions
  std::atomic<DeviceState> state_{DeviceState::kStop};
  std::mutex op_mu_;  // serializes SetState
  bool state_loaded_ = false;
  SimTracker tracker_;

  mutable std::mutex mu_;  // guards pos_, pause_, quit_, in_kernel_
  std::condition_variable cv_;
  SimPosition pos_;
  bool pause_ = true;
  bool quit_ = false;
  bool in_kernel_ = false;
  std::atomic<uint64_t> kernels_run_{0};
  std::thread worker_;
};

Status SimTracker::Start() {
  for (auto& r : dev_->regions()) {
    if (r.dirty) r.dirty->ClearAll();
  }
  return Status::Ok();
}

Status SimTracker::Sync(uint32_t region, DirtyBitmap& out) {
  auto& regions = dev_->regions();
  if (region >= regions.size() || !regions[region].dirty) {
    return InvalidArgument(fmt::format("sim tracker: sync failed: no region {}", region));
  }
  if (out.pages() != regions[region].dirty->pages()) {
    return InvalidArgument(fmt::format("sim tracker: sync failed: bitmap has {} pages, region {} has {}",
                                       out.pages(), region, regions[region].dirty->pages()));
  }
  regions[region].dirty->ReadAndClearInto(out);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<SimDevice>> SimDevice::Create(const SimSpec& spec, SimRole role, Clock& clock) {
  auto dev = std::make_unique<SimDeviceImpl>(spec, role, clock);
  GM_RETURN_IF_ERROR(dev->Init());
  return std::unique_ptr<SimDevice>(std::move(dev));
}

}  // namespace gpumigrate
