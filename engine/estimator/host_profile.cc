// MeasureHostProfile: per-core rates of each stage a migrated byte passes, on
// this host, through the engine's own code (codec, frame protector, page hash),
// and the JSON file that carries them to another host (`calibrate --profile-out`).
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/devices/sim/content.h"
#include "engine/session/page_hashes.h"
#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/estimator/projection.h"
#include "transport/crypto/frame_protector.h"

namespace gpumigrate {
namespace {

constexpr size_t kBlock = 1 << 20;
constexpr size_t kPage = 64 << 10;
constexpr size_t kBlocks = 32;  // 32 MiB of data cycled through

using Clk = std::chrono::steady_clock;

volatile uint64_t g_sink = 0;  // keeps the page hashes from being optimised away

// Runs `step(i)` (which handles kBlock bytes) until `budget` has passed; bytes/s.
double Rate(std::chrono::nanoseconds budget, const std::function<void(size_t)>& step) {
  const auto start = Clk::now();
  size_t i = 0;
  do {
    step(i++);
  } while (Clk::now() - start < budget);
  const double s = std::chrono::duration<double>(Clk::now() - start).count();
  return static_cast<double>(i) * kBlock / s;
}

std::vector<std::byte> WeightData() {
  std::vector<std::byte> d(kBlocks * kBlock);
  for (size_t p = 0; p < d.size() / kPage; ++p) {
    sim::FillPage(42, 0, p, 1, sim::ContentKind::kWeights, std::span(d).subspan(p * kPage, kPage));
  }
  return d;
}

// One loopback TCP stream, sender and receiver threads: bytes/s.
Result<double> TcpRate(std::chrono::nanoseconds budget) {
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ls < 0) return Status::FromErrno(errno, "host profile: socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(ls, 1) != 0 ||
      getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int e = errno;
    close(ls);
    return Status::FromErrno(e, "host profile: loopback listen");
  }
  int cs = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (cs < 0 || connect(cs, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int e = errno;
    if (cs >= 0) close(cs);
    close(ls);
    return Status::FromErrno(e, "host profile: loopback connect");
  }
  int as = accept(ls, nullptr, nullptr);
  close(ls);
  if (as < 0) {
    const int e = errno;
    close(cs);
    return Status::FromErrno(e, "host profile: loopback accept");
  }
  std::thread rx([as] {
    std::vector<char> buf(kBlock);
    while (read(as, buf.data(), buf.size()) > 0) {
    }
  });
  std::vector<char> block(kBlock, 'x');
  bool failed = false;
  const double rate = Rate(budget, [&](size_t) {
    size_t off = 0;
    while (!failed && off < block.size()) {
      ssize_t n = send(cs, block.data() + off, block.size() - off, MSG_NOSIGNAL);
      if (n <= 0) failed = true;
      else off += static_cast<size_t>(n);
    }
  });
  shutdown(cs, SHUT_WR);
  rx.join();
  close(cs);
  close(as);
  if (failed) return Internal("host profile: the loopback TCP stream failed");
  return rate;
}

std::string NowUtc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

void MeasureCodec(std::chrono::nanoseconds budget, const std::vector<std::byte>& data, CodecKind k, double* comp,
                  double* decomp) {
  FrameEncoder enc;
  FrameDecoder dec;
  std::vector<std::byte> out;
  *comp = Rate(budget, [&](size_t i) { enc.Encode(k, 1, std::span(data).subspan((i % kBlocks) * kBlock, kBlock), out); });
  std::vector<std::byte> raw(kBlock);
  const CodecKind used = enc.Encode(k, 1, std::span(data).first(kBlock), out);
  *decomp = Rate(budget, [&](size_t) {
    if (used == CodecKind::kNone) {
      std::memcpy(raw.data(), data.data(), kBlock);
    } else {
      (void)dec.Decode(used, out, raw);
    }
  });
}

}  // namespace

Result<HostProfile> MeasureHostProfile(std::chrono::nanoseconds budget) {
  HostProfile p;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  p.host = host;
  p.measured_at = NowUtc();
  p.cores = std::max(1u, std::thread::hardware_concurrency());
  const std::vector<std::byte> data = WeightData();
  std::vector<std::byte> dst(kBlock);
  StageRates& r = p.per_core;
  r.copy = Rate(budget, [&](size_t i) { std::memcpy(dst.data(), data.data() + (i % kBlocks) * kBlock, kBlock); });
  uint64_t sink = 0;
  r.hash = Rate(budget, [&](size_t i) {
    const auto block = std::span(data).subspan((i % kBlocks) * kBlock, kBlock);
    for (size_t o = 0; o < kBlock; o += kPage) {
      const auto page = block.subspan(o, kPage);
      sink += IsZeroPage(page) ? 0 : HashPage(page);
    }
  });
  FrameKeys keys;
  keys.aes_gcm = true;
  for (size_t i = 0; i < keys.aes_key.size(); ++i) keys.aes_key[i] = static_cast<std::byte>(i * 7 + 1);
  auto prot = MakeFrameProtector(keys);
  std::vector<std::byte> header(48), scratch;
  wire::Tag tag{};
  bool sealed = true;
  r.aes_gcm = Rate(budget, [&](size_t i) {
    sealed &= prot->Seal(header, 0, i, std::span(data).subspan((i % kBlocks) * kBlock, kBlock), scratch, tag).ok();
  });
  if (!sealed) return Internal("host profile: AES-GCM seal failed");
  GM_ASSIGN_OR_RETURN(r.tcp, TcpRate(budget));
  MeasureCodec(budget, data, CodecKind::kZstd, &r.zstd_compress, &r.zstd_decompress);
  MeasureCodec(budget, data, CodecKind::kShuffleZstd, &r.shuffle_compress, &r.shuffle_decompress);
  MeasureCodec(budget, data, CodecKind::kBf16, &r.bf16_compress, &r.bf16_decompress);
  p.method = fmt::format(
      "one core per stage, {:.1f} s each, 1 MiB blocks of bf16 weight-like data (the sim's content), codecs at "
      "level 1 through the engine's codec layer, AES-256-GCM through its frame protector (seal), page hash = zero "
      "test + XXH3 per 64 KiB page, tcp = one loopback TCP stream with a sending and a receiving thread",
      std::chrono::duration<double>(budget).count());
  g_sink = sink;
  return p;
}

std::string HostProfileToJson(const HostProfile& p) {
  const StageRates& r = p.per_core;
  nlohmann::ordered_json j{{"version", p.version},
                           {"kind", "gpumigrate host profile"},
                           {"host", p.host},
                           {"measured_at", p.measured_at},
                           {"cores", p.cores},
                           {"per_core_bytes_per_s",
                            {{"copy", r.copy},
                             {"hash", r.hash},
                             {"aes_gcm", r.aes_gcm},
                             {"tcp", r.tcp},
                             {"zstd_compress", r.zstd_compress},
                             {"zstd_decompress", r.zstd_decompress},
                             {"shuffle_compress", r.shuffle_compress},
                             {"shuffle_decompress", r.shuffle_decompress},
                             {"bf16_compress", r.bf16_compress},
                             {"bf16_decompress", r.bf16_decompress}}},
                           {"method", p.method}};
  return j.dump(2);
}

Status SaveHostProfile(const HostProfile& p, const std::string& path) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << HostProfileToJson(p) << "\n";
    if (!out) return Status::FromErrno(errno, fmt::format("host profile: write {}", tmp));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Internal(fmt::format("host profile: rename {} to {}: {}", tmp, path, ec.message()));
  return Status::Ok();
}

Result<HostProfile> LoadHostProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument(fmt::format("host profile {}: cannot open it: {}", path, std::strerror(errno)));
  const auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Corrupt(fmt::format("host profile {}: not a JSON object", path));
  HostProfile p;
  try {
    if (j.value("version", 0) != 1) {
      return Corrupt(fmt::format("host profile {}: version {} (this gpumigrate reads version 1)", path,
                                 j.value("version", 0)));
    }
    p.host = j.value("host", "");
    p.measured_at = j.value("measured_at", "");
    p.method = j.value("method", "");
    p.cores = j.at("cores").get<uint32_t>();
    const auto& r = j.at("per_core_bytes_per_s");
    StageRates& s = p.per_core;
    const std::pair<const char*, double*> keys[] = {
        {"copy", &s.copy},  {"hash", &s.hash}, {"aes_gcm", &s.aes_gcm}, {"tcp", &s.tcp},
        {"zstd_compress", &s.zstd_compress}, {"zstd_decompress", &s.zstd_decompress},
        {"shuffle_compress", &s.shuffle_compress}, {"shuffle_decompress", &s.shuffle_decompress}};
    for (const auto& [k, v] : keys) {
      if (!r.contains(k)) return Corrupt(fmt::format("host profile {}: per_core_bytes_per_s.{} is missing", path, k));
      *v = r.at(k).get<double>();
      if (!(*v > 0)) return Corrupt(fmt::format("host profile {}: per_core_bytes_per_s.{} must be > 0", path, k));
    }
    // Optional: a profile written before the bf16 codec has none (0: a target
    // pipeline that needs them says the stage has no measured rate).
    for (const auto& [k, v] : {std::pair{"bf16_compress", &s.bf16_compress}, std::pair{"bf16_decompress", &s.bf16_decompress}}) {
      if (!r.contains(k)) continue;
      *v = r.at(k).get<double>();
      if (!(*v > 0)) return Corrupt(fmt::format("host profile {}: per_core_bytes_per_s.{} must be > 0", path, k));
    }
  } catch (const nlohmann::json::exception& e) {
    return Corrupt(fmt::format("host profile {}: {}", path, e.what()));
  }
  if (p.cores == 0) return Corrupt(fmt::format("host profile {}: cores must be > 0", path));
  return p;
}

std::string DefaultHostProfilePath() {
  return (std::filesystem::path(DefaultCalibrationPath()).parent_path() / "host-profile.json").string();
}

Result<HostProfile> LoadOrMeasureHostProfile(bool force) {
  const std::string path = DefaultHostProfilePath();
  if (!force && std::filesystem::exists(path)) {
    auto p = LoadHostProfile(path);
    if (p.ok()) return p;
  }
  GM_ASSIGN_OR_RETURN(HostProfile p, MeasureHostProfile());
  GM_RETURN_IF_ERROR(SaveHostProfile(p, path));
  return p;
}

}  // namespace gpumigrate
