#include "cli/report_print.h"

#include <fmt/format.h>

#include "gpumigrate/units.h"

namespace gpumigrate::cli {

void PrintReport(FILE* out, const std::string& title, const MigrationReport& r) {
  fmt::print(out, "{}: {}", title, OutcomeName(r.outcome));
  if (r.outcome == Outcome::kCompleted) {
    fmt::print(out, ", {}", r.verified ? "verified (per-page digests of every region match)" : "NOT verified");
    if (r.verify_full) fmt::print(out, ", source re-read at stop and matched");
  }
  fmt::print(out, "\n");
  if (!r.status.ok()) fmt::print(out, "  error:      {}\n", r.status.message());
  if (!r.resolution.empty()) fmt::print(out, "  resolution: {}\n", r.resolution);
  fmt::print(out, "  device:     {} ({})\n", r.device, FormatBytes(static_cast<double>(r.device_bytes)));
  fmt::print(out, "  sent:       {} in {} rounds, total {:.2f} s, pre-copy throughput {}\n",
             FormatBytes(static_cast<double>(r.bytes_sent)), r.rounds.size(), r.total_ms / 1e3,
             FormatRate(r.bandwidth_bytes_per_s));
  if (!r.rounds.empty()) {
    fmt::print(out, "  {:>6}  {:>12}  {:>12}  {:>9}  {:>9}  {:>10}\n", "round", "considered", "sent", "pages",
               "zero", "ms");
    for (const auto& x : r.rounds) {
      fmt::print(out, "  {:>6}  {:>12}  {:>12}  {:>9}  {:>9}  {:>10.1f}\n",
                 x.final ? std::string("final") : std::to_string(x.round),
                 FormatBytes(static_cast<double>(x.dirty_bytes)), FormatBytes(static_cast<double>(x.bytes)),
                 x.pages_sent, x.zero_pages, x.ms);
    }
  }
  if (!r.codecs.empty()) {
    std::string line;
    for (const auto& c : r.codecs) {
      line += fmt::format("{}{} {}", line.empty() ? "" : ", ", c.region, c.codec);
      if (c.sampled_zstd_ratio > 0) line += fmt::format(" (sampled zstd {:.2f}, shuffle {:.2f})", c.sampled_zstd_ratio, c.sampled_shuffle_ratio);
    }
    fmt::print(out, "  codecs:     {}; overall ratio {:.3f}\n", line, r.compression_ratio);
  }
  if (!r.switchover_reason.empty()) fmt::print(out, "  switchover: {}\n", r.switchover_reason);
  if (r.outcome == Outcome::kCompleted) {
    fmt::print(out, "  stun:       {:.1f} ms", r.stun_ms);
    if (r.predicted_stun_ms >= 0) fmt::print(out, " (predicted {:.1f} ms)", r.predicted_stun_ms);
    fmt::print(out, "\n");
    for (const auto& [k, v] : r.stun_breakdown_ms) fmt::print(out, "    {:<16} {:>9.2f} ms\n", k, v);
  }
}

int ExitCodeFor(const MigrationReport& r) {
  switch (r.outcome) {
    case Outcome::kCompleted: return 0;
    case Outcome::kAborted: return 1;
    case Outcome::kInDoubt: return 3;
  }
  return 1;
}

}  // namespace gpumigrate::cli
