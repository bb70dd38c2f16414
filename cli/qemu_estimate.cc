#include "cli/qemu_estimate.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "cli/estimate_command.h"
#include "cli/estimate_plot.h"
#include "cli/gnuplot.h"
#include "cli/path_calibration.h"
#include "cli/print.h"
#include "cli/qemu_hook.h"
#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/devices/open_device.h"
#include "gpumigrate/qemu/qmp.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

namespace {

constexpr double kRamLinkShare = 0.5;

std::string LinkModelText() {
  return "QEMU's RAM and the device share the link: half each while both send, all of it for whoever sends alone; "
         "QEMU's remainder travels beside the device's final round";
}

// The device memory's own dirty rate over QEMU's sampling window: QEMU's page
// sampling hashes the shared block too, so this part of its figure is the device's.
double DeviceDirtyRate(const DeviceProfile& d, double window_s) {
  double bytes = 0;
  for (const auto& r : d.regions) {
    bytes += r.dirty.Eval(window_s, WorkingSetCurve::Bound::kMid, static_cast<double>(r.info.size_bytes));
  }
  return window_s > 0 ? bytes / window_s : 0;
}

int Fail(int code, const Status& s) {
  Print(stderr, "gpumigrate estimate: {}\n", s.message());
  return code;
}

}  // namespace

BesideMemory QemuBeside(const QemuEstimate& q) {
  BesideMemory b;
  b.name = "guest RAM";
  b.bytes = static_cast<double>(q.ram.ram_bytes);
  b.dirty_bytes_per_s = q.ram_dirty_bytes_per_s;
  b.dirty_window_s = q.ram.sample_s;
  b.page_bytes = q.ram.page_bytes;
  b.link_share = kRamLinkShare;
  return b;
}

void AddQemuAssumptions(const QemuEstimate& q, std::vector<std::string>& out) {
  const QemuRamProfile& r = q.ram;
  out.push_back(fmt::format(
      "QEMU {} at {}: guest RAM {} = machine memory {}{} (x-ignore-shared leaves share=on backends to the engine); "
      "ROM blocks are not counted",
      r.qemu_version, q.qmp_path, FormatBytes(static_cast<double>(r.ram_bytes)),
      FormatBytes(static_cast<double>(r.machine_bytes)),
      r.shared_in_machine ? fmt::format(" - share=on backends {}", FormatBytes(static_cast<double>(r.shared_bytes)))
                          : std::string(" (the share=on backends lie outside it)")));
  out.push_back(fmt::format(
      "RAM dirty rate {}: QEMU's page-sampling estimate over {:.0f} s ({} in whole MiB/s, over every RAM block, "
      "{} pages sampled per GiB){}",
      FormatRate(q.ram_dirty_bytes_per_s), r.sample_s, FormatRate(r.vm_dirty_bytes_per_s), r.sample_pages_per_gib,
      r.shared_bytes > 0 ? fmt::format(" minus the device memory's own {} measured over the same window",
                                       FormatRate(q.device_dirty_bytes_per_s))
                         : std::string()));
  out.push_back("the hook lifts QEMU's 128 MiB/s max-bandwidth (uncapped unless migrate --bandwidth), so QEMU is "
                "assumed to keep up with its share of the link");
}

nlohmann::ordered_json QemuEstimateJson(const QemuEstimate& q, const EstimateReport& rep) {
  const QemuRamProfile& r = q.ram;
  const ModelRun& m = rep.prediction.mid;
  return {{"qmp", q.qmp_path},
          {"qemu_version", r.qemu_version},
          {"ram_bytes", r.ram_bytes},
          {"machine_bytes", r.machine_bytes},
          {"shared_bytes", r.shared_bytes},
          {"shared_in_machine", r.shared_in_machine},
          {"page_bytes", r.page_bytes},
          {"dirty_rate_bytes_per_s", q.ram_dirty_bytes_per_s},
          {"vm_dirty_rate_bytes_per_s", r.vm_dirty_bytes_per_s},
          {"device_dirty_rate_bytes_per_s", q.device_dirty_bytes_per_s},
          {"dirty_sample_s", r.sample_s},
          {"dirty_sample_mode", "page-sampling"},
          {"sample_pages_per_gib", r.sample_pages_per_gib},
          {"link_model", {{"ram_share_while_both_send", kRamLinkShare}, {"description", LinkModelText()}}},
          {"guest_stun_ms", m.stun_ms},
          {"device_stun_ms", m.device_stun_ms},
          {"ram_sent_bytes", std::llround(m.beside_bytes)},
          {"ram_final_bytes", std::llround(m.beside_final_bytes)},
          {"paused_first", m.beside_paused_first},
          {"stopped_before_switchover_ms", m.stopped_before_switchover_ms},
          {"converge_ms", m.converge_ms},
          {"held_rounds", m.held_rounds}};
}

int RunQemuEstimate(const EstimateFlags& f) {
  QemuFlags qf;
  qf.qmp = f.qemu;
  if (Status s = CheckQemuUse(qf, f.device, true); !s.ok()) return Fail(2, s);
  if (!f.project.empty() || f.project_table) {
    return Fail(2, InvalidArgument("--qemu estimates this VM as it runs: --project and --project-table do not apply"));
  }
  auto opts = MakeEstimateOptions(f);
  auto warmup = ParseDuration(f.warmup);
  auto dirty_sample = ParseDuration(f.qemu_dirty_sample);
  if (!opts.ok()) return Fail(2, opts.status());
  if (!warmup.ok()) return Fail(2, warmup.status());
  if (!dirty_sample.ok()) return Fail(2, dirty_sample.status());
  const auto sample_s = std::chrono::duration_cast<std::chrono::seconds>(*dirty_sample);
  if (sample_s != *dirty_sample || sample_s.count() < 1 || sample_s.count() > 60) {
    return Fail(2, InvalidArgument(fmt::format("--qemu-dirty-sample {}: QEMU 7.2 samples whole seconds, 1s to 60s",
                                               f.qemu_dirty_sample)));
  }
  if (!f.plot.empty()) {
    if (Status p = CheckPlotTarget(f.plot); !p.ok()) return Fail(2, p);
  }
  auto dev = OpenDevice(f.device, true);
  if (!dev.ok()) return Fail(2, dev.status());
  QmpOptions qo;
  qo.connect_timeout = std::chrono::seconds(3);  // a QEMU that is not there fails here, not after the sample
  auto qmp = QmpClient::Connect(f.qemu, qo);
  if (!qmp.ok()) return Fail(2, qmp.status().WithContext(fmt::format("QEMU at {}", f.qemu)));
  // Checked before anything takes time: a QEMU that is paused or migrating is refused.
  auto status = (*qmp)->QueryStatus();
  if (!status.ok()) return Fail(2, status.status().WithContext(fmt::format("QEMU at {}", f.qemu)));
  if (!status->running) {
    return Fail(2, FailedPrecondition(fmt::format("QEMU at {} is {}, expected running", f.qemu, status->status)));
  }
  auto cal = LoadOrCalibrate(opts->recalibrate);
  if (!cal.ok()) return Fail(1, cal.status());
  // The device's rounds go the path `migrate --qemu` takes (its transport,
  // streams and codec, between two processes), measured while this VM runs
  // beside it as it will during the migration: not the in-process pipeline.
  if (Status s = AttachPathCalibration(f.transport, f.streams, f.device, *opts, PathPrograms("estimate")); !s.ok()) {
    return Fail(1, s);
  }
  Print(stderr, "observing {} and QEMU {} for {} (after {} warm-up)...\n", dev->device->Describe(),
        (*qmp)->socket_path(), f.sample, f.warmup);
  std::this_thread::sleep_for(*warmup);

  QemuEstimate q;
  q.qmp_path = f.qemu;
  auto started = StartQemuRamProfile(**qmp, sample_s);
  if (!started.ok()) return Fail(2, started.status());
  q.ram = *started;
  auto measured = ProfileDevice(*dev->device, opts->sample, SystemClock());
  if (!measured.ok()) return Fail(1, measured.status());
  if (Status s = FinishQemuRamProfile(**qmp, q.ram, sample_s + std::chrono::seconds(10)); !s.ok()) return Fail(1, s);
  (*qmp)->Close();  // nothing was started: the guest runs on as it did

  if (q.ram.shared_bytes > 0) q.device_dirty_bytes_per_s = DeviceDirtyRate(*measured, q.ram.sample_s);
  q.ram_dirty_bytes_per_s = std::max(0.0, q.ram.vm_dirty_bytes_per_s - q.device_dirty_bytes_per_s);
  EstimateOptions o = *opts;
  o.beside = QemuBeside(q);
  auto report = EstimateFromProfile(*measured, o, *cal);
  if (!report.ok()) return Fail(1, report.status());
  AddQemuAssumptions(q, report->assumptions);
  if (f.json) {
    auto j = nlohmann::ordered_json::parse(EstimateToJson(*report));
    j["qemu"] = QemuEstimateJson(q, *report);
    Print("{}\n", j.dump());
  } else {
    PrintEstimate(stdout, *report);
  }
  DrawEstimatePlot(f.plot, *report, fmt::format("gpumigrate estimate --device {} --qemu {}", f.device, f.qemu));
  return 0;
}

}  // namespace gpumigrate::cli
