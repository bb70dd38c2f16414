#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/session/report.h"
#include "gpumigrate/session/session.h"

namespace gpumigrate {

std::string_view PhaseName(Phase p) {
  switch (p) {
    case Phase::kHandshake: return "handshake";
    case Phase::kRoundStart: return "round-start";
    case Phase::kRoundEnd: return "round-end";
    case Phase::kSwitchover: return "switchover";
    case Phase::kPrepareSent: return "prepare-sent";
    case Phase::kPreparedReceived: return "prepared-received";
    case Phase::kCommitSent: return "commit-sent";
    case Phase::kCompleted: return "completed";
    case Phase::kPrepareReceived: return "prepare-received";
    case Phase::kPreparedSent: return "prepared-sent";
    case Phase::kCommitReceived: return "commit-received";
    case Phase::kReconnecting: return "reconnecting";
    case Phase::kResumed: return "resumed";
  }
  return "unknown";
}

std::string StepName(StepAt s) {
  switch (s.step) {
    case Step::kNone: return "";
    case Step::kConnect: return "connect";
    case Step::kHandshake: return "handshake";
    case Step::kPreCopy: return fmt::format("pre-copy round {}", s.round);
    case Step::kStopDevice: return "switchover: stop device";
    case Step::kFinalSync: return "switchover: final sync";
    case Step::kFinalData: return "switchover: final data";
    case Step::kDeviceState: return "switchover: device state";
    case Step::kVerifyFull: return "switchover: verify full";
    case Step::kPrepare: return "switchover: prepare";
    case Step::kCommit: return "commit";
  }
  return "";
}

bool IsSwitchoverStep(Step s) { return s >= Step::kStopDevice && s <= Step::kPrepare; }

std::vector<std::pair<std::string_view, double>> StunBreakdown::Phases() const {
  std::vector<std::pair<std::string_view, double>> out;
  const std::pair<std::string_view, const std::optional<double>*> all[] = {
      {"stop_device", &stop_device_ms},   {"final_sync", &final_sync_ms},
      {"final_data", &final_data_ms},     {"device_state", &device_state_ms},
      {"verify_full", &verify_full_ms},   {"prepare_verify", &prepare_verify_ms},
      {"commit_resume", &commit_resume_ms}};
  for (const auto& [name, v] : all) {
    if (v->has_value()) out.emplace_back(name, **v);
  }
  return out;
}

namespace {
double Round3(double v) { return std::round(v * 1000.0) / 1000.0; }

// Each round: what it sent and how long it took (and, where it offered pages by digest, how that went).
nlohmann::ordered_json RoundsJson(const MigrationReport& r) {
  nlohmann::ordered_json rounds = nlohmann::ordered_json::array();
  for (const auto& x : r.rounds) {
    rounds.push_back({{"round", x.round},
                      {"final", x.final},
                      {"bytes", x.bytes},
                      {"dirty_bytes", x.dirty_bytes},
                      {"pages_sent", x.pages_sent},
                      {"zero_pages", x.zero_pages},
                      {"known_pages", x.known_pages},
                      {"raw_bytes", x.raw_bytes},
                      {"payload_bytes", x.payload_bytes},
                      {"ms", Round3(x.ms)},
                      {"start_ms", Round3(x.start_ms)}});
    if (x.offered_pages > 0) {
      rounds.back()["offered_pages"] = x.offered_pages;
      rounds.back()["offer_missed_pages"] = x.offer_missed_pages;
      rounds.back()["offer_ms"] = Round3(x.offer_ms);
    }
  }
  return rounds;
}

// The codec each region was sent with, and the ratios its sample measured.
nlohmann::ordered_json CodecsJson(const MigrationReport& r) {
  nlohmann::ordered_json codecs = nlohmann::ordered_json::array();
  for (const auto& c : r.codecs) {
    nlohmann::ordered_json x{{"region", c.region}, {"codec", c.codec}};
    if (c.sampled_zstd_ratio > 0) {
      x["sampled_zstd_ratio"] = Round3(c.sampled_zstd_ratio);
      x["sampled_shuffle_ratio"] = Round3(c.sampled_shuffle_ratio);
      x["sampled_bf16_ratio"] = Round3(c.sampled_bf16_ratio);
    }
    codecs.push_back(x);
  }
  return codecs;
}

// What each data stream carried.
nlohmann::ordered_json StreamsJson(const MigrationReport& r) {
  nlohmann::ordered_json streams = nlohmann::ordered_json::array();
  for (const auto& st : r.streams) {
    streams.push_back({{"stream", st.stream},
                       {"bytes", st.bytes},
                       {"frames", st.frames},
                       {"bytes_per_s", std::round(st.bytes_per_s)}});
  }
  return streams;
}

// Each broken connection resumed over a new one; `saved`: the bytes the resumptions did not send again.
nlohmann::ordered_json ResumptionsJson(const MigrationReport& r, uint64_t& saved) {
  nlohmann::ordered_json resumptions = nlohmann::ordered_json::array();
  for (const auto& x : r.resumptions) {
    resumptions.push_back({{"round", x.round},
                           {"reason", x.reason},
                           {"reconnect_ms", Round3(x.reconnect_ms)},
                           {"saved_bytes", x.saved_bytes},
                           {"resent_bytes", x.resent_bytes}});
    saved += x.saved_bytes;
  }
  return resumptions;
}
}  // namespace

std::string ReportToJson(const MigrationReport& r) {
  nlohmann::ordered_json j;
  j["outcome"] = OutcomeName(r.outcome);
  j["verified"] = r.verified;
  j["verify_full"] = r.verify_full;
  j["stun_ms"] = Round3(r.stun_ms);
  if (r.stun_start_ms > 0) j["stun_start_ms"] = Round3(r.stun_start_ms);
  nlohmann::ordered_json bd = nlohmann::ordered_json::object();
  for (const auto& [k, v] : r.stun_breakdown_ms.Phases()) bd[std::string(k)] = Round3(v);
  j["stun_breakdown_ms"] = bd;
  j["total_ms"] = Round3(r.total_ms);
  j["bytes_sent"] = r.bytes_sent;
  j["bandwidth_bytes_per_s"] = std::round(r.bandwidth_bytes_per_s);
  j["rounds_bandwidth_bytes_per_s"] = std::round(r.rounds_bandwidth_bytes_per_s);
  j["rounds"] = RoundsJson(r);
  if (r.predicted_stun_ms >= 0 && std::isfinite(r.predicted_stun_ms)) {
    j["predicted_stun_ms"] = Round3(r.predicted_stun_ms);
  } else {
    j["predicted_stun_ms"] = nullptr;
  }
  j["switchover_reason"] = r.switchover_reason;
  j["stop_reason"] = std::string(StopReasonName(r.stop_reason));
  j["drain_recommended"] = r.drain_recommended;
  j["compression_ratio"] = Round3(r.compression_ratio);
  if (r.source_workers > 0) j["source_workers"] = r.source_workers;
  if (r.destination_workers) j["destination_workers"] = *r.destination_workers;
  j["codecs"] = CodecsJson(r);
  j["streams"] = StreamsJson(r);
  uint64_t saved = 0;
  j["resumptions"] = ResumptionsJson(r, saved);
  j["resume_saved_bytes"] = saved;
  j["dedup_pages"] = r.dedup_pages;
  j["dedup_bytes"] = r.dedup_bytes;
  j["offered_pages"] = r.offered_pages;
  if (r.content_store_pages > 0) j["content_store_pages"] = r.content_store_pages;
  if (r.dry_run) {
    j["dry_run"] = true;
    j["would_switch"] = r.would_switch;
  }
  j["device"] = r.device;
  j["device_bytes"] = r.device_bytes;
  if (!r.status.ok()) {
    j["error"] = r.status.message();
    j["failed_phase"] = StepName(r.failed_phase);
  }
  if (!r.source_cleanup.ok()) j["cleanup_error"] = r.source_cleanup.message();
  if (!r.scrub.empty()) {
    j["scrubbed"] = r.scrubbed;
    j["scrub_ms"] = Round3(r.scrub_ms);
    j["scrub"] = r.scrub;
  }
  if (!r.resolution.empty()) j["resolution"] = r.resolution;
  return j.dump();
}

std::string_view SourceFateName(SourceFate f) {
  switch (f) {
    case SourceFate::kRelease: return "release";
    case SourceFate::kResume: return "resume";
    case SourceFate::kStop: return "stop";
  }
  return "?";
}

}  // namespace gpumigrate
