#include "cli/source_flags.h"

#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

void AddLimitFlags(CLI::App* c, LimitFlags& f) {
  c->add_option("--downtime-target", f.downtime_target, "Switch over once the predicted stun is within this")
      ->capture_default_str();
  c->add_option("--max-stun", f.max_stun,
                "Longest acceptable stun: if rounds stop shrinking, switch over when the predicted stun is within "
                "this, else abort (the source runs on) and recommend drain-and-replace")
      ->capture_default_str();
  c->add_option("--max-rounds", f.max_rounds, "Most pre-copy rounds before the max-stun rule applies")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
}

Result<SwitchoverLimits> ParseLimitFlags(const LimitFlags& f) {
  SwitchoverLimits l;
  auto target = ParseDuration(f.downtime_target);
  if (!target.ok()) return target.status().WithContext("--downtime-target");
  auto max_stun = ParseDuration(f.max_stun);
  if (!max_stun.ok()) return max_stun.status().WithContext("--max-stun");
  l.downtime_target = *target;
  l.max_stun = *max_stun;
  l.max_rounds = f.max_rounds;
  return l;
}

void AddSourceFlags(CLI::App* c, SourceFlags& f, bool with_streams) {
  if (with_streams) {
    c->add_option("--streams", f.streams, "Data streams between source and destination")
        ->check(CLI::Range(1, 64))
        ->capture_default_str();
  }
  AddLimitFlags(c, f.limits);
  c->add_option("--max-total", f.max_total,
                "Time budget of the whole migration, stun included: abort (the source runs on) as soon as even the "
                "best case at the link's measured rate would end after it (default: none)");
  c->add_option("--bandwidth", f.bandwidth, "Cap the sending rate to emulate a slower link, e.g. 10Gbit or 500MB/s");
  c->add_option("--codec", f.codec,
                "Payload codec: none, zstd[:LEVEL], shuffle[:LEVEL] (byte planes of 16-bit values, then zstd), bf16 "
                "(bfloat16 exponents entropy-coded, mantissas raw: for model weights), or auto (per region, only "
                "where it beats the --bandwidth cap; never when uncapped)")
      ->capture_default_str();
  c->add_option("--verify", f.verify,
                "digest: the destination checks per-page digests of all it applied; full: also re-read the whole "
                "source at stop and compare (lengthens the stun; shown as its own line)")
      ->check(CLI::IsMember({"digest", "full"}))
      ->capture_default_str();
  c->add_option("--if-not-converging", f.if_not_converging,
                "When rounds stop shrinking and the stun would exceed --max-stun: abort (recommend "
                "drain-and-replace) or switch over anyway")
      ->check(CLI::IsMember({"abort", "switch"}))
      ->capture_default_str();
  c->add_flag("--no-scrub", f.no_scrub,
              "After a completed migration, leave the released source's memory as it is (default: zero it, so the "
              "next tenant of that memory cannot read this workload's data; skip it only when the device is "
              "destroyed anyway)");
  c->add_option("--threads", f.threads,
                "Threads that read the device, hash its pages and compress them, ahead of the session thread that "
                "sends them in order (0: this host's cores, at most 8); each data stream's own thread seals its frames")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  c->add_flag("--no-content-offer", f.no_content_offer,
              "Never offer pages by SHA-256 to a destination with a content store (receive --content-store): send "
              "every page's bytes");
}

Result<SourceOptions> MakeSourceOptions(const SourceFlags& f) {
  SourceOptions o;
  GM_ASSIGN_OR_RETURN(SwitchoverLimits limits, ParseLimitFlags(f.limits));
  o.downtime_target = limits.downtime_target;
  o.max_stun = limits.max_stun;
  o.max_rounds = limits.max_rounds;
  if (!f.max_total.empty()) {
    GM_ASSIGN_OR_RETURN(o.max_total, ParseDuration(f.max_total));
    if (o.max_total.count() <= 0) return InvalidArgument("--max-total: must be more than zero");
  }
  o.verify_full = f.verify == "full";
  GM_ASSIGN_OR_RETURN(o.codec, ParseCodecChoice(f.codec));
  o.switch_when_not_converging = f.if_not_converging == "switch";
  o.scrub = !f.no_scrub;
  o.content_offer = !f.no_content_offer;
  o.workers = f.threads;
  if (!f.bandwidth.empty()) {
    GM_ASSIGN_OR_RETURN(o.bandwidth_limit_bytes_per_s, ParseRateBytesPerS(f.bandwidth));
  }
  return o;
}

}  // namespace gpumigrate::cli
