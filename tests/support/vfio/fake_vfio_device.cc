#include "tests/support/vfio/fake_vfio_device.h"

#include <cerrno>
#include <cstring>

#include "gpumigrate/devices/device.h"

namespace gpumigrate::vfio::fake {
namespace {

constexpr uint32_t E = kStateError, S = kStateStop, R = kStateRunning, SC = kStateStopCopy, RS = kStateResuming,
                   RP = kStateRunningP2P, PC = kStatePreCopy, PP = kStatePreCopyP2P;

// vfio_main.c vfio_mig_get_next_state: vfio_from_fsm_table[cur][target], the
// next step from `cur` toward `target`, indexed by state number
// (ERROR, STOP, RUNNING, STOP_COPY, RESUMING, RUNNING_P2P, PRE_COPY, PRE_COPY_P2P).
constexpr uint32_t kNextState[kStateCount][kStateCount] = {
    /* ERROR */ {E, E, E, E, E, E, E, E},
    /* STOP */ {E, S, RP, SC, RS, RP, RP, RP},
    /* RUNNING */ {E, RP, R, RP, RP, RP, PC, RP},
    /* STOP_COPY */ {E, S, S, SC, S, S, E, E},
    /* RESUMING */ {E, S, S, S, RS, S, S, S},
    /* RUNNING_P2P */ {E, S, R, S, S, RP, R, PP},
    /* PRE_COPY */ {E, R, R, PP, R, R, PC, PP},
    /* PRE_COPY_P2P */ {E, RP, RP, SC, RP, RP, PC, PP},
};

// state_flags_table: the migration flags a state needs (ERROR: never requestable).
constexpr uint64_t kNeeds[kStateCount] = {
    ~uint64_t{0},
    VFIO_MIGRATION_STOP_COPY,
    VFIO_MIGRATION_STOP_COPY,
    VFIO_MIGRATION_STOP_COPY,
    VFIO_MIGRATION_STOP_COPY,
    VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_P2P,
    VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_PRE_COPY,
    VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_P2P | VFIO_MIGRATION_PRE_COPY,
};

bool Running(uint32_t s) { return s == R || s == RP || s == PC || s == PP; }
bool Saving(uint32_t s) { return s == PC || s == PP || s == SC; }

class DeviceFile final : public File {
 public:
  explicit DeviceFile(std::shared_ptr<FakeVfioDevice> d) : dev_(std::move(d)) {}
  int Ioctl(FakeKernel& k, unsigned long request, void* arg) override {
    if (request == VFIO_DEVICE_BIND_IOMMUFD) return Bind(k, static_cast<vfio_device_bind_iommufd*>(arg));
    if (dev_->cdev() && !bound_) return -EINVAL;
    if (request == VFIO_DEVICE_FEATURE) return dev_->FeatureIoctl(k, static_cast<vfio_device_feature*>(arg));
    if (request == VFIO_DEVICE_RESET) return dev_->Reset();
    return -ENOTTY;  // includes VFIO_MIG_GET_PRECOPY_INFO (= VFIO_EEH_PE_OP here)
  }
  void OnClose(FakeKernel&) override { dev_->Closed(); }

 private:
  int Bind(FakeKernel& k, vfio_device_bind_iommufd* b) {
    if (!dev_->cdev()) return -ENOTTY;
    if (b->argsz < sizeof(*b) || b->flags != 0 || bound_) return -EINVAL;
    if (!k.Find(b->iommufd)) return -EBADF;
    bound_ = true;
    b->out_devid = 1;
    return 0;
  }

  std::shared_ptr<FakeVfioDevice> dev_;
  bool bound_ = false;
};

class DataFile final : public File {
 public:
  DataFile(std::shared_ptr<FakeVfioDevice> d, uint64_t session) : dev_(std::move(d)), session_(session) {}
  ssize_t Read(FakeKernel&, void* buf, size_t len) override { return dev_->SaveRead(session_, buf, len); }
  ssize_t Write(FakeKernel&, const void* buf, size_t len) override { return dev_->ResumeWrite(session_, buf, len); }
  int Ioctl(FakeKernel&, unsigned long request, void* arg) override {
    if (request != VFIO_MIG_GET_PRECOPY_INFO) return -ENOTTY;
    return dev_->PrecopyInfo(session_, static_cast<vfio_precopy_info*>(arg));
  }

 private:
  std::shared_ptr<FakeVfioDevice> dev_;
  uint64_t session_;
};

// vfio_check_feature: 1 = go on, 0 = PROBE answered, < 0 = error.
int CheckFeature(uint32_t flags, size_t payload, uint32_t ops, size_t minsz) {
  if ((flags & (VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_SET)) & ~ops) return -EINVAL;
  if (flags & VFIO_DEVICE_FEATURE_PROBE) return 0;
  if (!(flags & (VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_SET))) return -EINVAL;
  if (payload < minsz) return -EINVAL;
  return 1;
}

// A device in this state may initiate P2P DMA / can answer it.
bool Initiates(uint32_t s) { return s == R || s == PC; }
bool Answers(uint32_t s) { return Running(s); }

}  // namespace

size_t FakeP2PBus::Join(uint32_t state) {
  std::lock_guard lk(mu_);
  states_.push_back(state);
  return states_.size() - 1;
}

void FakeP2PBus::Arc(size_t id, uint32_t from, uint32_t to) {
  std::lock_guard lk(mu_);
  states_[id] = to;
  for (size_t j = 0; j < states_.size(); ++j) {
    if (j == id) continue;
    if ((Initiates(to) && !Answers(states_[j])) || (!Answers(to) && Initiates(states_[j]))) {
      violations_.push_back("device " + std::to_string(id) + " " + std::string(DeviceStateName(DeviceState(from))) +
                            " -> " + std::string(DeviceStateName(DeviceState(to))) + " while device " +
                            std::to_string(j) + " was " + std::string(DeviceStateName(DeviceState(states_[j]))));
    }
  }
}

void FakeP2PBus::Set(size_t id, uint32_t state) {
  std::lock_guard lk(mu_);
  states_[id] = state;
}

std::vector<std::string> FakeP2PBus::Violations() {
  std::lock_guard lk(mu_);
  return violations_;
}

std::shared_ptr<FakeVfioDevice> FakeVfioDevice::Create(FakeVfioConfig cfg) {
  return std::shared_ptr<FakeVfioDevice>(new FakeVfioDevice(cfg));
}

FakeVfioDevice::FakeVfioDevice(FakeVfioConfig cfg)
    : cfg_(cfg),
      state_(cfg.initial_state),
      memory_(cfg.memory_bytes),
      dirty_((cfg.memory_bytes + cfg.chunk_bytes - 1) / cfg.chunk_bytes),
      sent_once_(dirty_.size()) {
  if (cfg_.p2p_bus) bus_id_ = cfg_.p2p_bus->Join(state_);
}

std::shared_ptr<File> FakeVfioDevice::OpenFile() {
  if (opened_.exchange(true)) return nullptr;
  return std::make_shared<DeviceFile>(shared_from_this());
}

bool FakeVfioDevice::WriteMemory(uint64_t offset, std::span<const std::byte> bytes) {
  std::lock_guard lk(mu_);
  if (!Running(state_) || offset > memory_.size() || bytes.size() > memory_.size() - offset) return false;
  std::memcpy(memory_.data() + offset, bytes.data(), bytes.size());
  if (bytes.empty()) return true;
  for (uint64_t c = offset / cfg_.chunk_bytes; c <= (offset + bytes.size() - 1) / cfg_.chunk_bytes; ++c) {
    dirty_[c] = true;
  }
  return true;
}

std::vector<std::byte> FakeVfioDevice::Memory() {
  std::lock_guard lk(mu_);
  return memory_;
}

uint32_t FakeVfioDevice::state() {
  std::lock_guard lk(mu_);
  return state_;
}

std::vector<uint32_t> FakeVfioDevice::Steps() {
  std::lock_guard lk(mu_);
  return steps_;
}

bool FakeVfioDevice::Supported(uint32_t s) const {
  return s < kStateCount && (kNeeds[s] & cfg_.migration_flags) == kNeeds[s];
}

int FakeVfioDevice::FeatureIoctl(FakeKernel& k, vfio_device_feature* f) {
  if (f->argsz < sizeof(*f)) return -EINVAL;
  constexpr uint32_t kKnown = VFIO_DEVICE_FEATURE_MASK | VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_SET |
                              VFIO_DEVICE_FEATURE_PROBE;
  if (f->flags & ~kKnown) return -EINVAL;
  const bool get = f->flags & VFIO_DEVICE_FEATURE_GET, set = f->flags & VFIO_DEVICE_FEATURE_SET;
  if (!(f->flags & VFIO_DEVICE_FEATURE_PROBE) && get && set) return -EINVAL;
  const size_t payload = f->argsz - sizeof(*f);
  switch (f->flags & VFIO_DEVICE_FEATURE_MASK) {
    case VFIO_DEVICE_FEATURE_DMA_LOGGING_START:
    case VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP:
    case VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT:  // independent of migration support
      return cfg_.dma_log ? cfg_.dma_log->Feature(f) : -ENOTTY;
    default: break;
  }
  if (cfg_.migration_flags == 0) return -ENOTTY;  // no migration: no migration features at all
  switch (f->flags & VFIO_DEVICE_FEATURE_MASK) {
    case VFIO_DEVICE_FEATURE_MIGRATION: {
      int c = CheckFeature(f->flags, payload, VFIO_DEVICE_FEATURE_GET, sizeof(vfio_device_feature_migration));
      if (c <= 0) return c;
      reinterpret_cast<vfio_device_feature_migration*>(f->data)->flags = cfg_.migration_flags;
      return 0;
    }
    case VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE: {
      int c = CheckFeature(f->flags, payload, VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_SET,
                           sizeof(vfio_device_feature_mig_state));
      if (c <= 0) return c;
      auto* st = reinterpret_cast<vfio_device_feature_mig_state*>(f->data);
      if (get) {
        std::lock_guard lk(mu_);
        st->device_state = state_;
        st->data_fd = -1;
        return 0;
      }
      return SetState(k, st->device_state, &st->data_fd);
    }
    case VFIO_DEVICE_FEATURE_MIG_DATA_SIZE: {
      int c = CheckFeature(f->flags, payload, VFIO_DEVICE_FEATURE_GET, sizeof(vfio_device_feature_mig_data_size));
      if (c <= 0) return c;
      std::lock_guard lk(mu_);
      const uint64_t all = dirty_.size() * (sizeof(FakeRecord) + cfg_.chunk_bytes);
      reinterpret_cast<vfio_device_feature_mig_data_size*>(f->data)->stop_copy_length =
          Saving(state_) ? PendingBytesLocked() : all;
      return 0;
    }
    default: return -ENOTTY;
  }
}

// The driver's loop around vfio_mig_get_next_state: one arc at a time.
int FakeVfioDevice::SetState(FakeKernel& k, uint32_t target, int32_t* data_fd) {
  std::lock_guard lk(mu_);
  *data_fd = -1;
  if (!Supported(state_) || !Supported(target)) return -EINVAL;
  while (state_ != target) {
    uint32_t next = kNextState[state_][target];
    while (next != kStateError && !Supported(next)) next = kNextState[next][target];  // skip unsupported states
    if (next == kStateError) return -EINVAL;                  // a blocked transition: the state is unchanged
    if (int r = Step(k, next, data_fd); r < 0) return r;
  }
  return 0;
}

int FakeVfioDevice::Step(FakeKernel& k, uint32_t next, int32_t* data_fd) {
  auto into = [&](std::atomic<int64_t>& a) {
    int64_t want = next;
    return a.compare_exchange_strong(want, -1);
  };
  if (faults.fail_next_arc.exchange(false) || into(faults.fail_on_arc_into)) return -EIO;
  if (faults.error_on_next_arc.exchange(false) || into(faults.error_on_arc_into)) {
    state_ = kStateError;
    if (cfg_.p2p_bus) cfg_.p2p_bus->Set(bus_id_, E);
    ++session_;
    saving_ = false;
    return -EIO;
  }
  const uint32_t cur = state_;
  steps_.push_back(next);
  const bool opens_save = (cur == S && next == SC) || (cur == R && next == PC) || (cur == RP && next == PP);
  if (cur == RS && next == S && !partial_.empty()) {  // the resume stream ended mid-record
    state_ = kStateError;
    if (cfg_.p2p_bus) cfg_.p2p_bus->Set(bus_id_, E);
    ++session_;
    return -EINVAL;
  }
  state_ = next;
  if (cfg_.p2p_bus) cfg_.p2p_bus->Arc(bus_id_, cur, next);
  const bool session_over = (saving_ && !Saving(next)) || (cur == RS);
  if (session_over) {
    ++session_;
    saving_ = false;
  }
  if (opens_save || next == RS) {
    ++session_;
    saving_ = opens_save;
    record_.clear();
    record_pos_ = 0;
    bytes_read_ = 0;
    partial_.clear();
    std::fill(sent_once_.begin(), sent_once_.end(), false);
    if (opens_save) std::fill(dirty_.begin(), dirty_.end(), true);  // everything is initial data
    // Installs under mu_: the fake kernel never calls a file with its own lock held.
    *data_fd = k.Install(std::make_shared<DataFile>(shared_from_this(), session_));
  }
  return 0;
}

int FakeVfioDevice::Reset() {
  std::lock_guard lk(mu_);
  state_ = kStateRunning;
  ++session_;
  saving_ = false;
  partial_.clear();
  std::fill(memory_.begin(), memory_.end(), std::byte{0});  // a reset device starts from scratch
  ++resets_;
  if (cfg_.p2p_bus) cfg_.p2p_bus->Set(bus_id_, R);
  return 0;
}

uint64_t FakeVfioDevice::PendingBytesLocked() const {
  uint64_t n = 0;
  for (bool d : dirty_) n += d;
  return n * (sizeof(FakeRecord) + cfg_.chunk_bytes) + (record_.size() - record_pos_);
}

// Takes the lowest pending chunk into record_; false when none is pending.
bool FakeVfioDevice::NextRecordLocked() {
  for (size_t c = 0; c < dirty_.size(); ++c) {
    if (!dirty_[c]) continue;
    const uint64_t off = c * cfg_.chunk_bytes;
    const size_t len = std::min<size_t>(cfg_.chunk_bytes, memory_.size() - off);
    FakeRecord h{off, static_cast<uint32_t>(len), kFakeRecordMagic};
    record_.resize(sizeof(h) + len);
    std::memcpy(record_.data(), &h, sizeof(h));
    std::memcpy(record_.data() + sizeof(h), memory_.data() + off, len);
    record_pos_ = 0;
    record_initial_ = !sent_once_[c];
    dirty_[c] = false;
    sent_once_[c] = true;
    return true;
  }
  return false;
}

ssize_t FakeVfioDevice::SaveRead(uint64_t session, void* buf, size_t len) {
  std::lock_guard lk(mu_);
  if (session != session_ || !saving_) return -ENODEV;  // the session ended
  int64_t fail_after = faults.read_error_after_bytes.load();
  if (fail_after >= 0 && bytes_read_ >= static_cast<uint64_t>(fail_after)) return -EIO;
  const int64_t window = faults.precopy_bytes_per_info.load();
  if (state_ != kStateStopCopy && window >= 0 && read_since_info_ >= static_cast<uint64_t>(window)) return -ENOMSG;
  if (record_pos_ == record_.size() && !NextRecordLocked()) {
    return state_ == kStateStopCopy ? 0 : -ENOMSG;  // end of stream / end for now
  }
  size_t n = std::min({len, cfg_.max_read_bytes, record_.size() - record_pos_});
  read_since_info_ += n;
  std::memcpy(buf, record_.data() + record_pos_, n);
  record_pos_ += n;
  bytes_read_ += n;
  return static_cast<ssize_t>(n);
}

void FakeVfioDevice::ApplyLocked(std::span<const std::byte> in) {
  partial_.insert(partial_.end(), in.begin(), in.end());
  size_t pos = 0;
  while (partial_.size() - pos >= sizeof(FakeRecord)) {
    FakeRecord h;
    std::memcpy(&h, partial_.data() + pos, sizeof(h));
    if (partial_.size() - pos - sizeof(h) < h.length) break;
    std::memcpy(memory_.data() + h.offset, partial_.data() + pos + sizeof(h), h.length);
    pos += sizeof(h) + h.length;
  }
  partial_.erase(partial_.begin(), partial_.begin() + static_cast<std::ptrdiff_t>(pos));
}

ssize_t FakeVfioDevice::ResumeWrite(uint64_t session, const void* buf, size_t len) {
  std::lock_guard lk(mu_);
  if (session != session_ || state_ != kStateResuming) return -ENODEV;
  if (faults.refuse_resume_stream.load()) return -EINVAL;
  // Validate whole records before applying any: a bad header is the driver's -EINVAL.
  std::vector<std::byte> all(partial_);
  auto* p = static_cast<const std::byte*>(buf);
  all.insert(all.end(), p, p + len);
  for (size_t pos = 0; all.size() - pos >= sizeof(FakeRecord);) {
    FakeRecord h;
    std::memcpy(&h, all.data() + pos, sizeof(h));
    if (h.magic != kFakeRecordMagic || h.offset > memory_.size() || h.length > memory_.size() - h.offset) {
      return -EINVAL;
    }
    pos += sizeof(h) + h.length;
    if (pos > all.size()) break;
  }
  size_t n = std::min(len, cfg_.max_read_bytes);  // short writes too
  ApplyLocked(std::span(p, n));
  return static_cast<ssize_t>(n);
}

int FakeVfioDevice::PrecopyInfo(uint64_t session, vfio_precopy_info* info) {
  std::lock_guard lk(mu_);
  if (session != session_ || !saving_) return -ENODEV;
  if (state_ != kStatePreCopy && state_ != kStatePreCopyP2P) return -EINVAL;
  if (info->argsz < sizeof(*info)) return -EINVAL;
  info->flags = 0;
  read_since_info_ = 0;
  uint64_t initial = 0, dirty = 0;
  const uint64_t rec = sizeof(FakeRecord) + cfg_.chunk_bytes;
  for (size_t c = 0; c < dirty_.size(); ++c) {
    if (dirty_[c]) (sent_once_[c] ? dirty : initial) += rec;
  }
  (record_initial_ ? initial : dirty) += record_.size() - record_pos_;
  if (faults.lie_precopy_sizes.load()) initial = dirty = 0;
  info->initial_bytes = initial;
  info->dirty_bytes = dirty;
  return 0;
}

}  // namespace gpumigrate::vfio::fake
