#include "engine/planner/estimate_json.h"

#include <fmt/format.h>

#include "gpumigrate/codec/codec.h"

namespace gpumigrate::planner {
namespace {

std::chrono::nanoseconds Ms(double ms) { return std::chrono::nanoseconds(static_cast<int64_t>(ms * 1e6)); }

Result<RegionProfile> ParseRegion(const Json& r, const std::string& path) {
  if (!r.is_object()) return KeyError(path, fmt::format("expected an object, got {}", Describe(r)));
  RegionProfile rp;
  GM_ASSIGN_OR_RETURN(int64_t id, Required(ReadInt(r, "id", path, 0, UINT32_MAX), Child(path, "id")));
  rp.info.id = static_cast<uint32_t>(id);
  GM_ASSIGN_OR_RETURN(auto name, ReadString(r, "name", path));
  rp.info.name = name.value_or(fmt::format("region {}", id));
  GM_ASSIGN_OR_RETURN(int64_t size, Required(ReadInt(r, "size_bytes", path, 0, INT64_MAX), Child(path, "size_bytes")));
  rp.info.size_bytes = static_cast<uint64_t>(size);
  GM_ASSIGN_OR_RETURN(double nz, Required(ReadNumber(r, "nonzero_fraction", path, 0), Child(path, "nonzero_fraction")));
  if (nz > 1) return KeyError(Child(path, "nonzero_fraction"), fmt::format("{} is more than 1", nz));
  rp.nonzero_fraction = nz;
  GM_ASSIGN_OR_RETURN(auto page, ReadInt(r, "page_size", path, 1, UINT32_MAX));
  rp.info.page_size = static_cast<uint32_t>(page.value_or(4096));
  GM_ASSIGN_OR_RETURN(auto hint, ReadString(r, "hint", path));
  // Estimates from before the key have none: their regions are not known static.
  rp.info.hint = hint == "static" ? RegionHint::kStatic : hint == "dynamic" ? RegionHint::kDynamic : RegionHint::kUnknown;
  GM_ASSIGN_OR_RETURN(auto held, ReadNumber(r, "held_fraction", path, 0));
  if (held && *held > 1) return KeyError(Child(path, "held_fraction"), fmt::format("{} is more than 1", *held));
  rp.held_fraction = held.value_or(0);
  GM_ASSIGN_OR_RETURN(auto ratio, ReadNumber(r, "compression_ratio", path, 0));
  if (ratio && *ratio <= 0) return KeyError(Child(path, "compression_ratio"), "must be more than 0");
  rp.compression_ratio = ratio.value_or(1.0);
  GM_ASSIGN_OR_RETURN(auto codec, ReadString(r, "codec", path));
  rp.codec = codec.value_or("none");
  if (!FindCodecByName(rp.codec)) {
    return KeyError(Child(path, "codec"), fmt::format("unknown codec '{}' (none, zstd, shuffle-zstd, bf16)", rp.codec));
  }
  struct Field {
    const char* key;
    double CodecSample::*member;
    double min;
  };
  for (Field f : {Field{"sampled_zstd_ratio", &CodecSample::zstd_ratio, 0},
                  Field{"sampled_zstd_bytes_per_s", &CodecSample::zstd_bytes_per_s, 0},
                  Field{"sampled_shuffle_ratio", &CodecSample::shuffle_ratio, 0},
                  Field{"sampled_shuffle_bytes_per_s", &CodecSample::shuffle_bytes_per_s, 0},
                  // Absent from estimates made before the bf16 codec: not sampled, never chosen.
                  Field{"sampled_bf16_ratio", &CodecSample::bf16_ratio, 0},
                  Field{"sampled_bf16_bytes_per_s", &CodecSample::bf16_bytes_per_s, 0}}) {
    GM_ASSIGN_OR_RETURN(auto v, ReadNumber(r, f.key, path, f.min));
    if (v) rp.codecs.*f.member = *v;
  }
  const std::string wpath = Child(path, "dirty_working_set");
  const Json& w = Get(r, "dirty_working_set");
  if (!w.is_null()) {
    if (!w.is_array()) return KeyError(wpath, fmt::format("expected an array, got {}", Describe(w)));
    double last_window = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string sp = Index(wpath, i);
      if (!w[i].is_object()) return KeyError(sp, "expected an object {window_ms, low_bytes, mid_bytes, high_bytes}");
      GM_ASSIGN_OR_RETURN(double window, Required(ReadNumber(w[i], "window_ms", sp, 0), Child(sp, "window_ms")));
      if (window <= last_window) {
        return KeyError(Child(sp, "window_ms"), "windows must be positive and increasing");
      }
      last_window = window;
      GM_ASSIGN_OR_RETURN(double lo, Required(ReadNumber(w[i], "low_bytes", sp, 0), Child(sp, "low_bytes")));
      GM_ASSIGN_OR_RETURN(double mid, Required(ReadNumber(w[i], "mid_bytes", sp, 0), Child(sp, "mid_bytes")));
      GM_ASSIGN_OR_RETURN(double hi, Required(ReadNumber(w[i], "high_bytes", sp, 0), Child(sp, "high_bytes")));
      rp.dirty.window_s.push_back(window / 1e3);
      rp.dirty.low_bytes.push_back(lo);
      rp.dirty.mid_bytes.push_back(mid);
      rp.dirty.high_bytes.push_back(hi);
    }
  }
  return rp;
}

}  // namespace

Result<VmEstimate> ParseVmEstimate(const Json& e, const std::string& path) {
  VmEstimate est;
  if (!e.is_object()) return KeyError(path, fmt::format("expected an object, got {}", Describe(e)));
  est.present = true;
  GM_ASSIGN_OR_RETURN(est.link_text, Required(ReadString(e, "link", path), Child(path, "link")));
  GM_ASSIGN_OR_RETURN(est.link_bytes_per_s, Required(ReadRate(e, "link", path), Child(path, "link")));
  GM_ASSIGN_OR_RETURN(est.stun_ms, Required(ReadNumber(e, "predicted_stun_ms", path, 0),
                                            Child(path, "predicted_stun_ms")));
  GM_ASSIGN_OR_RETURN(est.total_ms, Required(ReadNumber(e, "predicted_total_ms", path, 0),
                                             Child(path, "predicted_total_ms")));
  if (est.total_ms < est.stun_ms) {
    return KeyError(Child(path, "predicted_total_ms"),
                    fmt::format("{} is less than predicted_stun_ms {}", est.total_ms, est.stun_ms));
  }
  const Json& regions = Get(e, "regions");
  if (regions.is_null()) return est;
  // The measured profile: the whole output of `gpumigrate estimate --json`.
  const std::string rpath = Child(path, "regions");
  if (!regions.is_array()) return KeyError(rpath, fmt::format("expected an array, got {}", Describe(regions)));
  DeviceProfile p;
  GM_ASSIGN_OR_RETURN(auto device, ReadString(e, "device", path));
  p.device = device.value_or("");
  for (size_t i = 0; i < regions.size(); ++i) {
    GM_ASSIGN_OR_RETURN(RegionProfile rp, ParseRegion(regions[i], Index(rpath, i)));
    p.regions.push_back(std::move(rp));
  }
  GM_ASSIGN_OR_RETURN(auto state, ReadInt(e, "device_state_bytes", path, 0, INT64_MAX));
  p.device_state_bytes = static_cast<uint64_t>(state.value_or(0));
  GM_ASSIGN_OR_RETURN(auto fixed, ReadNumber(e, "fixed_cost_ms", path, 0));
  GM_ASSIGN_OR_RETURN(auto target, ReadNumber(e, "downtime_target_ms", path, 0));
  GM_ASSIGN_OR_RETURN(auto rounds, ReadInt(e, "max_rounds", path, 1, 10000));
  GM_ASSIGN_OR_RETURN(auto pipe, ReadNumber(e, "pipeline_bytes_per_s", path, 0));
  est.params.fixed_cost = Ms(fixed.value_or(0));
  if (target) est.params.downtime_target = Ms(*target);
  if (rounds) est.params.max_rounds = static_cast<uint32_t>(*rounds);
  est.pipeline_bytes_per_s = pipe.value_or(0);
  GM_ASSIGN_OR_RETURN(auto offer, ReadNumber(e, "offer_bytes_per_s", path, 0));
  p.offer_bytes_per_s = offer.value_or(0);
  est.profile = std::move(p);
  return est;
}

}  // namespace gpumigrate::planner
