// Projection of an estimate to the hardware a migration will really run on:
// another host (cores, per-core stage rates, link, streams) and a larger GPU VM
// (per-GPU workload), so that "how long will my 8x80 GB VM freeze at 100 Gbit?"
// is answered from figures that can be checked, not from this 2-core host's
// pipeline.
//
// The pipeline model, of the engine as it is built: every raw byte costs each
// side CPU time in every stage it passes. On the source, the workers (as many
// as `migrate --threads`, by default DefaultSourceWorkers of the cores) read,
// hash and compress; the session thread copies each frame's payload behind its
// header; each data stream's thread seals (or tags) and sends. The destination
// runs one thread per stream that receives, and workers (as many as `receive
// --threads`, by default DefaultDestinationWorkers of its cores and streams)
// that open (or check the tag), decompress, hash and write; with none, each
// stream's thread does it all. A group of threads runs at
// min(threads, cores) over its summed per-byte time, and each side at most at
// cores over all its per-byte time. The migration runs at the lowest of these
// (with both sides' time summed when they share one host, as in a loopback
// check), the link, the NIC, and streams x the per-stream limit. Per-core
// stage rates are measured on this host (`gpumigrate calibrate`) or on the
// real target (`gpumigrate calibrate --profile-out FILE` there, `estimate
// --target FILE` here). Not modelled: a content store's offers (the session
// thread then encodes what it sends). Pure except MeasureHostProfile and the
// file functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpumigrate/codec/codec.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct DeviceProfile;

// Bytes per second one core moves through each stage (of raw bytes, except
// aes_gcm and tcp, which see wire bytes).
struct StageRates {
  double copy = 0;                // memcpy: reading the device, writing the destination
  double hash = 0;                // zero test + XXH3 per page (Prepare digests), each side
  double aes_gcm = 0;             // AES-256-GCM seal or open
  double tcp = 0;                 // one side's cost of a loopback TCP stream (send or receive)
  double zstd_compress = 0, zstd_decompress = 0;
  double shuffle_compress = 0, shuffle_decompress = 0;
  double bf16_compress = 0, bf16_decompress = 0;  // 0 in a profile from before the bf16 codec
};

struct HostProfile {
  int version = 1;
  std::string host;         // hostname where measured
  std::string measured_at;  // UTC, ISO 8601
  uint32_t cores = 0;       // online CPUs where measured
  StageRates per_core;
  std::string method;       // how the rates were measured, in words
};

// Measures each stage on one core for about `per_stage` on bf16-like data (the
// sim's weight content), 1 MiB blocks.
Result<HostProfile> MeasureHostProfile(std::chrono::nanoseconds per_stage = std::chrono::milliseconds(300));
Status SaveHostProfile(const HostProfile& p, const std::string& path);
// Fails (naming the file and the key) on a missing, damaged or incomplete profile.
Result<HostProfile> LoadHostProfile(const std::string& path);
std::string HostProfileToJson(const HostProfile& p);
// Next to the calibration (DefaultCalibrationPath's folder): host-profile.json.
std::string DefaultHostProfilePath();
// The stored profile of this host, or a fresh measurement (stored) when there
// is none, it is damaged or `force` is set.
Result<HostProfile> LoadOrMeasureHostProfile(bool force);

struct TargetSpec {
  double link_bytes_per_s = 0;        // 0: no link limit (in-process)
  double nic_bytes_per_s = 0;         // 0: as the link
  uint32_t streams = 4;               // data streams of the migration
  double per_stream_bytes_per_s = 0;  // 0: no per-stream limit
  uint32_t cores = 0;                 // cores per side available to the migration
  uint32_t source_workers = 0;        // the source's reading workers (migrate --threads); 0: the engine's
                                      // default for `cores` (DefaultSourceWorkers)
  // The destination's workers (receive --threads); unset: the engine's default
  // for `cores` and `streams` (DefaultDestinationWorkers); 0: none.
  std::optional<uint32_t> destination_workers;
  double device_read_bytes_per_s = 0; // one core's rate reading the device; 0: memcpy (per_core.copy)
  bool shared_host = false;           // source and destination share these cores (loopback)
  bool encrypted = true;              // AES-256-GCM frames (TLS); false: integrity tags only
  bool network = true;                // frames cross sockets (false: an in-process migration)
  StageRates per_core;
  std::string rates_source;           // where per_core came from, in words
};

struct PipelineLimit {
  std::string name;     // "source workers", "source session thread", "source send", "source CPU",
                        // "destination receive", "destination workers", "destination CPU",
                        // "shared CPU", "link", "NIC", "streams"
  double raw_bytes_per_s = 0;
  std::string detail;   // e.g. "4 cores / (read 0.1 + hash 0.2 + ... ns/B); largest: AES-GCM seal"
};

struct PipelineBound {
  double raw_bytes_per_s = 0;   // what the migration moves, before compression
  double wire_bytes_per_s = 0;  // raw / ratio: the model's bandwidth
  std::string binds;            // the name of the lowest limit
  std::vector<PipelineLimit> limits;
};

// The rate of a migration of data compressed by `codec` at `ratio` (raw/wire,
// >= 1) on `target`. A zero stage rate is a stage that was not measured: an
// error, not an infinitely fast stage.
Result<PipelineBound> TargetPipeline(const TargetSpec& target, CodecKind codec, double ratio);
// The destination's workers the model (and the engine) would run on `target`.
uint32_t DestinationWorkersOf(const TargetSpec& target);

// How the measured device stands for the projected one.
struct WorkloadProjection {
  enum class Mode {
    kScale,     // every region and every dirty curve scaled by size (the old --project)
    kSame,      // regions scaled by size, dirty curves as measured
    kPerGpu,    // the measured device is one GPU: N GPUs have N times its regions' sizes
                // (scaled to bytes_per_gpu) and N times its dirty rate, not size x
    kExplicit,  // per GPU: static_fraction of bytes_per_gpu never written, the rest a KV
                // cache appended at kv_rate_per_gpu (linear W(t) = rate t, capped)
  };
  Mode mode = Mode::kScale;
  uint32_t gpus = 1;
  uint64_t bytes_per_gpu = 0;
  double static_fraction = 0.7;
  double kv_rate_per_gpu = 0;  // bytes/s
};
std::string_view WorkloadModeName(WorkloadProjection::Mode m);  // "scale", "same", "per-gpu", "explicit"

// The projected profile; every assumption is appended to `assumptions`.
Result<DeviceProfile> ProjectWorkload(const DeviceProfile& measured, const WorkloadProjection& w,
                                      std::vector<std::string>* assumptions);

}  // namespace gpumigrate
