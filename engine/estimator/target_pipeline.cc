// TargetPipeline: the rate a migration reaches on a target host, from per-core
// stage rates, cores, streams and the link (gpumigrate/estimator/projection.h).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "gpumigrate/estimator/projection.h"
#include "gpumigrate/session/session.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {
namespace {

struct Stage {
  const char* name;
  double rate;         // bytes/s per core of the bytes it sees
  double per_raw = 1;  // bytes it sees per raw byte (1/ratio for wire-side stages)
};

// Seconds of one core per raw byte, and the costliest stage, in words.
struct SideCost {
  double s_per_byte = 0;
  std::string costliest;
  std::string detail;
};

Result<SideCost> Sum(const char* side, const std::vector<Stage>& stages) {
  SideCost c;
  double worst = -1;
  for (const Stage& st : stages) {
    if (!(st.rate > 0) || !std::isfinite(st.rate)) {
      return InvalidArgument(fmt::format("the {} stage '{}' has no measured per-core rate", side, st.name));
    }
    const double s = st.per_raw / st.rate;
    c.s_per_byte += s;
    c.detail += fmt::format("{}{} {:.3f}", c.detail.empty() ? "" : " + ", st.name, s * 1e9);
    if (s > worst) {
      worst = s;
      c.costliest = st.name;
    }
  }
  c.detail += " ns/B";
  return c;
}

// A codec's two stages: its name on each side and where its per-core rates sit.
struct CodecStages {
  const char* compress;
  const char* decompress;
  double StageRates::*compress_rate;
  double StageRates::*decompress_rate;
};

CodecStages StagesOf(CodecKind k) {
  switch (k) {
    case CodecKind::kZstd:
      return {"zstd compress", "zstd decompress", &StageRates::zstd_compress, &StageRates::zstd_decompress};
    case CodecKind::kBf16:
      return {"bf16 compress", "bf16 decompress", &StageRates::bf16_compress, &StageRates::bf16_decompress};
    default:
      return {"shuffle+zstd compress", "shuffle+zstd decompress", &StageRates::shuffle_compress,
              &StageRates::shuffle_decompress};
  }
}

}  // namespace

namespace {

// A group of `threads` threads sharing the stages of `c`: min(threads, cores) of them at once.
void Group(PipelineBound& b, const TargetSpec& t, const char* name, uint32_t threads, const char* what,
           const SideCost& c) {
  const uint32_t used = std::min(threads, t.cores);
  b.limits.push_back({name, used / c.s_per_byte,
                      fmt::format("{} {} thread{} on {} cores ({}); costliest: {}", threads, what,
                                  threads == 1 ? "" : "s", t.cores, c.detail, c.costliest)});
}

// The destination's limits: each stream's thread doing it all (no workers),
// or the streams' threads receiving beside `workers` writing. `dc` (the
// workers' stages, or all of them) becomes the whole side's cost per byte.
Status DestinationGroups(PipelineBound& b, const TargetSpec& t, uint32_t workers, const std::vector<Stage>& recv,
                         SideCost& dc) {
  if (workers == 0) {
    Group(b, t, "destination CPU", t.streams, "receiving", dc);
    return Status::Ok();
  }
  double all = dc.s_per_byte;
  if (!recv.empty()) {
    GM_ASSIGN_OR_RETURN(SideCost rc, Sum("destination", recv));
    Group(b, t, "destination receive", t.streams, "receiving", rc);
    all += rc.s_per_byte;
  }
  Group(b, t, "destination workers", workers, "writing", dc);
  b.limits.push_back({"destination CPU", t.cores / all, fmt::format("all destination stages on {} cores", t.cores)});
  dc.s_per_byte = all;  // the shared-host limit counts both sides whole
  return Status::Ok();
}

}  // namespace

uint32_t DestinationWorkersOf(const TargetSpec& t) {
  return t.destination_workers ? *t.destination_workers : DefaultDestinationWorkers(t.cores, t.streams);
}

Result<PipelineBound> TargetPipeline(const TargetSpec& t, CodecKind codec, double ratio) {
  if (t.cores == 0) return InvalidArgument("the target has no cores for the migration");
  if (t.streams == 0) return InvalidArgument("the target has no data streams");
  if (!(ratio >= 1) || !std::isfinite(ratio)) ratio = 1;
  if (codec == CodecKind::kNone) ratio = 1;
  const StageRates& r = t.per_core;
  const double wire = 1 / ratio;
  const uint32_t workers = t.source_workers ? t.source_workers : DefaultSourceWorkers(t.cores);
  const double read = t.device_read_bytes_per_s > 0 ? t.device_read_bytes_per_s : r.copy;
  // The engine's source (engine/session/chunk_pipeline.h, frame_sender.h):
  // workers read, hash and compress each chunk; the session thread copies each
  // frame's payload behind its header; one thread per data stream seals
  // (or tags) and sends. The destination (frame_receiver.h): one thread per
  // stream receives; its workers open (or check the tag), decompress, hash
  // and write; without workers each stream's thread does it all.
  const uint32_t dst_workers = DestinationWorkersOf(t);
  std::vector<Stage> work{{"read", read}, {"page hash", r.hash}};
  std::vector<Stage> session{{"frame copy", r.copy, wire}};
  std::vector<Stage> send, recv, dst;
  if (t.network) recv.push_back({"socket receive", r.tcp, wire});
  dst.push_back(t.encrypted ? Stage{"AES-GCM open", r.aes_gcm, wire} : Stage{"tag check", r.hash, wire});
  if (codec != CodecKind::kNone) {
    const CodecStages c = StagesOf(codec);
    work.push_back({c.compress, r.*c.compress_rate});
    dst.push_back({c.decompress, r.*c.decompress_rate});
  }
  send.push_back(t.encrypted ? Stage{"AES-GCM seal", r.aes_gcm, wire} : Stage{"tag", r.hash, wire});
  if (t.network) send.push_back({"socket send", r.tcp, wire});
  dst.push_back({"page hash", r.hash});
  dst.push_back({"write", r.copy});
  GM_ASSIGN_OR_RETURN(SideCost wc, Sum("source", work));
  GM_ASSIGN_OR_RETURN(SideCost sc, Sum("source", session));
  GM_ASSIGN_OR_RETURN(SideCost nc, Sum("source", send));
  if (dst_workers == 0) {
    dst.insert(dst.begin(), recv.begin(), recv.end());
    recv.clear();
  }
  GM_ASSIGN_OR_RETURN(SideCost dc, Sum("destination", dst));

  PipelineBound b;
  Group(b, t, "source workers", workers, "reading", wc);
  Group(b, t, "source session thread", 1, "session", sc);
  Group(b, t, "source send", t.streams, "sending", nc);
  GM_RETURN_IF_ERROR(DestinationGroups(b, t, dst_workers, recv, dc));
  const double src_all = wc.s_per_byte + sc.s_per_byte + nc.s_per_byte;
  b.limits.push_back({"source CPU", t.cores / src_all, fmt::format("all source stages on {} cores", t.cores)});
  if (t.shared_host) {
    b.limits.push_back({"shared CPU", t.cores / (src_all + dc.s_per_byte),
                        fmt::format("source and destination share {} cores", t.cores)});
  }
  if (t.link_bytes_per_s > 0) {
    b.limits.push_back({"link", t.link_bytes_per_s * ratio, fmt::format("{} of wire bytes, compression x{:.2f}",
                                                                         FormatRate(t.link_bytes_per_s), ratio)});
  }
  if (t.nic_bytes_per_s > 0) {
    b.limits.push_back({"NIC", t.nic_bytes_per_s * ratio, FormatRate(t.nic_bytes_per_s)});
  }
  if (t.per_stream_bytes_per_s > 0) {
    b.limits.push_back({"streams", t.streams * t.per_stream_bytes_per_s * ratio,
                        fmt::format("{} x {}", t.streams, FormatRate(t.per_stream_bytes_per_s))});
  }
  const auto lowest = std::min_element(b.limits.begin(), b.limits.end(), [](const auto& x, const auto& y) {
    return x.raw_bytes_per_s < y.raw_bytes_per_s;
  });
  b.raw_bytes_per_s = lowest->raw_bytes_per_s;
  b.wire_bytes_per_s = b.raw_bytes_per_s / ratio;
  b.binds = lowest->name;
  return b;
}

}  // namespace gpumigrate
