#include "cli/report_print.h"

#include "cli/print.h"

#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

void PrintResumptions(FILE* out, const MigrationReport& r) {
  for (const auto& x : r.resumptions) {
    Print(out, "  resumed:    after a break in round {} ({}): {:.0f} ms to reconnect, {} confirmed kept, {} sent again\n",
          x.round, x.reason, x.reconnect_ms, FormatBytes(static_cast<double>(x.saved_bytes)),
          FormatBytes(static_cast<double>(x.resent_bytes)));
  }
}

void PrintReport(FILE* out, const std::string& title, const MigrationReport& r) {
  Print(out, "{}: {}", title, OutcomeName(r.outcome));
  if (r.outcome == Outcome::kCompleted) {
    Print(out, ", {}", r.verified ? "verified (per-page digests of every region match)" : "NOT verified");
    if (r.verify_full) Print(out, ", source re-read at stop and matched");
  }
  Print(out, "\n");
  if (!r.status.ok()) Print(out, "  error:      {}\n", r.status.message());
  if (!r.resolution.empty()) Print(out, "  resolution: {}\n", r.resolution);
  Print(out, "  device:     {} ({})\n", r.device, FormatBytes(static_cast<double>(r.device_bytes)));
  Print(out, "  sent:       {} in {} rounds, total {:.2f} s, pre-copy throughput {}\n",
             FormatBytes(static_cast<double>(r.bytes_sent)), r.rounds.size(), r.total_ms / 1e3,
             FormatRate(r.bandwidth_bytes_per_s));
  if (!r.rounds.empty()) {
    Print(out, "  {:>6}  {:>12}  {:>12}  {:>9}  {:>9}  {:>10}\n", "round", "considered", "sent", "pages",
               "zero", "ms");
    for (const auto& x : r.rounds) {
      Print(out, "  {:>6}  {:>12}  {:>12}  {:>9}  {:>9}  {:>10.1f}\n",
                 x.final ? std::string("final") : std::to_string(x.round),
                 FormatBytes(static_cast<double>(x.dirty_bytes)), FormatBytes(static_cast<double>(x.bytes)),
                 x.pages_sent, x.zero_pages, x.ms);
    }
  }
  if (!r.codecs.empty()) {
    std::string line;
    for (const auto& c : r.codecs) {
      line += fmt::format("{}{} {}", line.empty() ? "" : ", ", c.region, c.codec);
      if (c.sampled_zstd_ratio > 0) {
        line += fmt::format(" (sampled zstd {:.2f}, shuffle {:.2f}, bf16 {:.2f})", c.sampled_zstd_ratio,
                            c.sampled_shuffle_ratio, c.sampled_bf16_ratio);
      }
    }
    Print(out, "  codecs:     {}; overall ratio {:.3f}\n", line, r.compression_ratio);
  }
  if (r.streams.size() > 1) {
    std::string line;
    for (const auto& st : r.streams) {
      line += fmt::format("{}#{} {} ({})", line.empty() ? "" : ", ", st.stream,
                          FormatBytes(static_cast<double>(st.bytes)), FormatRate(st.bytes_per_s));
    }
    Print(out, "  streams:    {}\n", line);
  }
  PrintResumptions(out, r);
  if (r.offered_pages > 0 || r.content_store_pages > 0) {
    Print(out, "  content:    {} pages offered by SHA-256, {} filled from the destination's content store ({} not sent)",
          r.offered_pages, r.dedup_pages, FormatBytes(static_cast<double>(r.dedup_bytes)));
    if (r.content_store_pages > 0) Print(out, "; the store indexes {} pages", r.content_store_pages);
    Print(out, "\n");
  }
  if (!r.switchover_reason.empty()) Print(out, "  switchover: {}\n", r.switchover_reason);
  if (r.outcome == Outcome::kCompleted) {
    Print(out, "  stun:       {:.1f} ms", r.stun_ms);
    if (r.predicted_stun_ms >= 0) Print(out, " (predicted {:.1f} ms)", r.predicted_stun_ms);
    Print(out, "\n");
    for (const auto& [k, v] : r.stun_breakdown_ms.Phases()) Print(out, "    {:<16} {:>9.2f} ms\n", k, v);
  }
  if (!r.scrub.empty()) {
    Print(out, "  scrub:      {}", r.scrub);
    if (r.scrubbed) Print(out, " in {:.1f} ms, after the stun", r.scrub_ms);
    Print(out, "\n");
  }
}

// The probe's report: the rounds as measured beside the estimator's prediction.
void PrintProbe(FILE* out, const std::string& title, const MigrationReport& r, const EstimateReport& e) {
  const Prediction& p = e.prediction;
  Print(out, "{} --dry-run: probe {}, the engine {} switch over\n", title,
             r.status.ok() ? "complete" : "failed", r.would_switch ? "would" : "would NOT");
  if (!r.status.ok()) Print(out, "  error:      {}\n", r.status.message());
  Print(out, "  {}\n", r.resolution);
  Print(out, "  {:>6}  {:>12} {:>9}  {:>12} {:>9}\n", "round", "predicted", "ms", "measured", "ms");
  size_t n = std::max(p.mid.rounds.size(), r.rounds.size());
  for (size_t i = 0; i < n; ++i) {
    std::string pb = i < p.mid.rounds.size() ? FormatBytes(p.mid.rounds[i].bytes) : "-";
    std::string pm = i < p.mid.rounds.size() ? fmt::format("{:.1f}", p.mid.rounds[i].seconds * 1e3) : "-";
    std::string mb = i < r.rounds.size() ? FormatBytes(static_cast<double>(r.rounds[i].bytes)) : "-";
    std::string mm = i < r.rounds.size() ? fmt::format("{:.1f}", r.rounds[i].ms) : "-";
    Print(out, "  {:>6}  {:>12} {:>9}  {:>12} {:>9}\n", i, pb, pm, mb, mm);
  }
  Print(out, "  stun, estimated before anything moved:   {:.1f} ms (range {:.1f} to {:.1f}), {}\n", p.mid.stun_ms,
             p.stun_low_ms, p.stun_high_ms, EstimateDecisionName(p.decision));
  if (auto again = RepredictWithProbe(e, r)) {
    const Prediction& q = again->prediction;
    Print(out, "  stun, estimated again at the probe's round-0 rate ({}): {:.1f} ms (range {:.1f} to {:.1f}), {}\n",
          FormatRate(again->round0_bytes_per_s), q.mid.stun_ms, q.stun_low_ms, q.stun_high_ms,
          EstimateDecisionName(q.decision));
  }
  Print(out, "  stun, predicted from the probe's rounds: {:.1f} ms ({})\n", r.predicted_stun_ms,
             r.switchover_reason);
  Print(out, "  pre-copy: predicted {:.2f} s, measured {:.2f} s\n", (p.mid.total_ms - p.mid.stun_ms) / 1e3,
             r.total_ms / 1e3);
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
