// QemuRamProfile (gpumigrate/qemu/qemu.h): the guest RAM QEMU's own migration would
// move and how fast the guest dirties it, read over QMP without migrating.
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "gpumigrate/qemu/qemu.h"
#include "gpumigrate/qemu/qmp.h"
#include "qemu-plugin/qemu_common.h"

namespace gpumigrate {
namespace {

// The most pages per GiB QEMU 7.2 samples (MAX_SAMPLE_PAGE_COUNT): its default,
// 512, samples only 32 pages of a 64 MiB block.
constexpr uint32_t kSamplePagesPerGib = 4096;

uint64_t JsonBytes(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

}  // namespace

Result<QemuRamProfile> StartQemuRamProfile(QmpClient& qmp, std::chrono::seconds sample,
                                           std::chrono::milliseconds timeout) {
  if (sample.count() < 1 || sample.count() > 60) {
    return InvalidArgument(fmt::format("QEMU samples its dirty rate for whole seconds, 1 to 60 (not {} s)",
                                       sample.count()));
  }
  const std::string where = fmt::format("QEMU at {}", qmp.socket_path());
  QemuRamProfile p;
  p.qemu_version = qemu::VersionText(qmp.version());
  GM_ASSIGN_OR_RETURN(QmpRunState rs, qmp.QueryStatus(timeout));
  if (!rs.running) return FailedPrecondition(fmt::format("{} is {}, expected running", where, rs.status));
  GM_ASSIGN_OR_RETURN(nlohmann::json mig, qmp.QueryMigrate(timeout));
  const std::string status = mig.value("status", std::string("none"));
  if (status != "none" && status != "completed" && status != "cancelled" && status != "failed") {
    return FailedPrecondition(fmt::format("{} is migrating ({}): estimate before migrating", where, status));
  }

  auto summary = qmp.Execute("query-memory-size-summary", nullptr, timeout);
  if (!summary.ok()) return summary.status().WithContext(where);
  p.machine_bytes = JsonBytes(*summary, "base-memory") + JsonBytes(*summary, "plugged-memory");
  auto memdevs = qmp.Execute("query-memdev", nullptr, timeout);
  if (!memdevs.ok()) return memdevs.status().WithContext(where);
  uint64_t all_backends = 0;
  for (const auto& m : *memdevs) {
    const uint64_t size = JsonBytes(m, "size");
    all_backends += size;
    if (m.value("share", false)) p.shared_bytes += size;
  }
  // NUMA nodes' backends make up the machine's memory; a device's (ivshmem) lies beside it.
  p.shared_in_machine = p.shared_bytes > 0 && all_backends == p.machine_bytes;
  p.ram_bytes = p.machine_bytes - (p.shared_in_machine ? p.shared_bytes : 0);
  if (p.ram_bytes == 0) return FailedPrecondition(fmt::format("{} reports no guest RAM of its own to migrate", where));

  nlohmann::json args = {{"calc-time", sample.count()}, {"mode", "page-sampling"},
                         {"sample-pages", kSamplePagesPerGib}};
  auto calc = qmp.Execute("calc-dirty-rate", args, timeout);
  if (!calc.ok()) return calc.status().WithContext(fmt::format("{}: calc-dirty-rate", where));
  p.sample_s = static_cast<double>(sample.count());
  p.sample_pages_per_gib = kSamplePagesPerGib;
  return p;
}

Status FinishQemuRamProfile(QmpClient& qmp, QemuRamProfile& p, std::chrono::milliseconds wait,
                            std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    auto q = qmp.Execute("query-dirty-rate", nullptr, timeout);
    if (!q.ok()) return q.status().WithContext(fmt::format("QEMU at {}", qmp.socket_path()));
    const std::string status = q->value("status", std::string());
    if (status == "measured") {
      // QEMU 7.2 reports MiB/s (whole ones) over every sampled RAM block.
      p.vm_dirty_bytes_per_s = static_cast<double>(q->value("dirty-rate", int64_t{0})) * (1 << 20);
      return Status::Ok();
    }
    if (status != "measuring") {
      return FailedPrecondition(fmt::format("QEMU at {}: query-dirty-rate says {}, expected measuring or measured",
                                            qmp.socket_path(), status));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(StatusCode::kDeadlineExceeded, fmt::format("QEMU at {}: its dirty rate was not measured within {} ms",
                                          qmp.socket_path(), wait.count()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Result<QemuRamProfile> MeasureQemuRam(QmpClient& qmp, std::chrono::seconds sample) {
  GM_ASSIGN_OR_RETURN(QemuRamProfile p, StartQemuRamProfile(qmp, sample));
  GM_RETURN_IF_ERROR(FinishQemuRamProfile(qmp, p, sample + std::chrono::seconds(10)));
  return p;
}

}  // namespace gpumigrate
