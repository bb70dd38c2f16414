// The path calibration's runs (include/gpumigrate/estimator/path_calibration.h): the
// gpumigrate binary's own `receive` and `migrate` as two processes on loopback,
// with the transport, streams, codec and cap of the configuration, on a small
// sim device, or between gpumigrate-workload processes for a proc backend. Each
// run is a real migration between two processes, started through the launcher
// seam (gpumigrate/common/launcher.h); the fit turns their reports into the figures
// `estimate` models with.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpumigrate/common/launcher.h"
#include "gpumigrate/estimator/path_calibration.h"
#include "gpumigrate/estimator/path_spread.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/session/report.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

uint64_t DeviceBytes(const PathConfig& c) {
  if (const char* e = std::getenv("GPUMIGRATE_PATH_CALIBRATION_SIZE"); e && *e) {
    auto s = ParseSize(e);
    if (s.ok() && *s >= (4u << 20)) return *s;
  }
  constexpr uint64_t kMiB = 1 << 20;
  if (c.cap_bytes_per_s <= 0) return 512 * kMiB;
  const auto b = static_cast<uint64_t>(c.cap_bytes_per_s * 1.0);
  return std::clamp<uint64_t>(b / kMiB * kMiB, 64 * kMiB, 512 * kMiB);
}

// The device sizes of the two kinds of run. A proc run holds the memory twice
// (source and destination processes): at most 256 MiB.
uint64_t CalibrationBytes(const PathConfig& c, bool large_final) {
  uint64_t big = DeviceBytes(c);
  if (c.backend == "proc") big = std::min<uint64_t>(big, 256u << 20);
  return large_final ? big : std::max<uint64_t>(4u << 20, big / 4 >> 20 << 20);
}

std::string PathRunNowUtc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string PathRunSlurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string PathRunTail(const std::string& text) {
  std::string t = text.size() > 600 ? text.substr(text.size() - 600) : text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}

struct Scratch {
  fs::path dir;
  ~Scratch() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

// One child of a run: started through the launcher, its files in the scratch directory.
struct RunChild {
  Launcher::Started started;
  std::string out, err, rc;
};

Result<RunChild> StartChild(Launcher& l, const std::vector<std::string>& argv, const fs::path& dir,
                            const std::string& name) {
  RunChild c{{}, (dir / (name + ".out")).string(), (dir / (name + ".err")).string(), (dir / (name + ".rc")).string()};
  std::error_code ec;
  fs::remove(c.rc, ec);
  auto s = l.Start(argv, c.out, c.err, c.rc);
  if (!s.ok()) return s.status().WithContext(fmt::format("path calibration: start {}", argv.empty() ? "" : argv[0]));
  c.started = *s;
  return c;
}

// The workload processes of one proc run: asked to end (if still running) when it ends.
struct Workloads {
  Launcher* launcher = nullptr;
  std::vector<RunChild> children;
  ~Workloads() {
    for (auto& c : children) AwaitExit(*launcher, c.started, c.rc, 0ms);
  }
};

// Starts a gpumigrate-workload and waits up to 60 s for it to say it is ready
// ("ready pid=PID", once its shim serves) and for its shim's socket; returns
// the workload's process id.
Result<int64_t> StartWorkload(Launcher& l, const std::vector<std::string>& args, const fs::path& dir,
                              const std::string& name, Workloads& w) {
  GM_ASSIGN_OR_RETURN(RunChild c, StartChild(l, args, dir, name));
  w.children.push_back(c);
  for (int i = 0; i < 3000; ++i) {
    const std::string out = PathRunSlurp(c.out);
    const size_t at = out.find("ready pid=");
    if (at != std::string::npos) {
      const int64_t pid = std::atoll(out.c_str() + at + 10);
      std::error_code ec;
      if (pid > 0 && fs::exists(ProcShimSocket(static_cast<int>(pid)), ec)) return pid;
    }
    if (!l.Alive(c.started.id, c.started.token)) {
      w.children.pop_back();
      return Internal(fmt::format("path calibration: the {} workload exited before serving its shim: {}", name,
                                  PathRunTail(PathRunSlurp(c.err))));
    }
    std::this_thread::sleep_for(20ms);
  }
  return Status{StatusCode::kDeadlineExceeded,
                fmt::format("path calibration: the {} workload did not serve its shim within 60 s", name)};
}

// The device pair of one run: a sim spec on both sides, or for proc a source
// workload and an adopting destination started now.
struct RunDevices {
  std::string source, destination;
};

Result<RunDevices> StartDevices(const PathConfig& c, const PathRunPrograms& p, bool large_final, const fs::path& dir,
                                Workloads& w) {
  if (c.backend != "proc") {
    const std::string d = PathCalibrationDevice(c, large_final);
    return RunDevices{d, d};
  }
  if (p.workload.empty()) {
    return FailedPrecondition("a proc device's calibration migrates gpumigrate-workload processes: none was found");
  }
  const std::vector<std::string> spec = ProcCalibrationWorkload(c, large_final);
  std::vector<std::string> src{p.workload};
  src.insert(src.end(), spec.begin(), spec.end());
  std::vector<std::string> dst = src;
  dst.insert(dst.end(), {"--adopt", "--adopt-timeout", "240s"});
  GM_ASSIGN_OR_RETURN(int64_t s, StartWorkload(*w.launcher, src, dir, "source", w));
  GM_ASSIGN_OR_RETURN(int64_t d, StartWorkload(*w.launcher, dst, dir, "destination", w));
  return RunDevices{fmt::format("proc:{}", s), fmt::format("proc:{}", d)};
}

// Waits up to 30 s for the receiver to write the port it listens on.
Result<std::string> AwaitPort(Launcher& l, const RunChild& r, const std::string& port_file) {
  for (int i = 0; i < 1500; ++i) {
    std::string port;
    std::ifstream in(port_file);
    if (in) in >> port;
    if (!port.empty()) return port;
    if (!l.Alive(r.started.id, r.started.token)) {
      return Internal(fmt::format("path calibration: the receiver exited before listening: {}",
                                  PathRunTail(PathRunSlurp(r.err))));
    }
    std::this_thread::sleep_for(20ms);
  }
  AwaitExit(l, r.started, r.rc, 0ms);
  return Status{StatusCode::kDeadlineExceeded, "path calibration: the receiver did not listen within 30 s"};
}

// The migrate side of a run: the configuration's streams, codec and cap; a
// large final round forced (three rounds, then switch), or a nearly empty one.
std::vector<std::string> MigrateArgs(const PathConfig& c, const std::string& self, const std::string& port,
                                     const std::string& device, bool large_final) {
  std::vector<std::string> mig{self, "migrate", "--to", "127.0.0.1:" + port, "--device", device, "--streams",
                               std::to_string(c.streams), "--codec", c.codec, "--warmup", "0s", "--json"};
  if (c.cap_bytes_per_s > 0) {
    mig.insert(mig.end(), {"--bandwidth", fmt::format("{:.0f}B/s", c.cap_bytes_per_s)});
  }
  if (large_final) {
    // Rounds 1 and 2 carry the hot set (the round overhead), then the final one does.
    mig.insert(mig.end(), {"--downtime-target", "1ms", "--max-rounds", "3", "--if-not-converging", "switch"});
  } else {
    mig.insert(mig.end(), {"--downtime-target", "10s"});
  }
  return mig;
}

Result<PathRun> OneRun(const PathRunPrograms& p, Launcher& l, const PathConfig& c, bool large_final,
                       const fs::path& dir, const std::vector<std::string>& security) {
  Workloads w;
  w.launcher = &l;
  GM_ASSIGN_OR_RETURN(RunDevices devices, StartDevices(c, p, large_final, dir, w));
  const std::string& device = devices.source;
  const std::string port_file = (dir / "port").string();
  std::error_code ec;
  fs::remove(port_file, ec);
  std::vector<std::string> recv{p.gpumigrate, "receive", "--listen", "127.0.0.1:0", "--port-file", port_file,
                                "--device", devices.destination, "--accept-timeout", "60s", "--json"};
  recv.insert(recv.end(), security.begin(), security.end());
  GM_ASSIGN_OR_RETURN(RunChild r, StartChild(l, recv, dir, "recv"));
  GM_ASSIGN_OR_RETURN(std::string port, AwaitPort(l, r, port_file));
  std::vector<std::string> mig = MigrateArgs(c, p.gpumigrate, port, device, large_final);
  mig.insert(mig.end(), security.begin(), security.end());
  GM_ASSIGN_OR_RETURN(RunChild m, StartChild(l, mig, dir, "mig"));
  const int mrc = AwaitExit(l, m.started, m.rc, 180s);
  const int rrc = AwaitExit(l, r.started, r.rc, mrc == 0 ? 60s : 5s);
  if (mrc != 0 || rrc != 0) {
    return Internal(fmt::format("path calibration: a test migration of {} failed (migrate exit {}, receive exit {}): "
                                "{} {}",
                                device, mrc, rrc, PathRunTail(PathRunSlurp(m.err)), PathRunTail(PathRunSlurp(r.err))));
  }
  // A migrated source exits by itself; the destination checks the pages it
  // adopted and exits: a run whose workload finds its memory wrong failed.
  for (auto& child : w.children) {
    const int rc = AwaitExit(l, child.started, child.rc, 30s);
    if (rc != 0) {
      return Internal(fmt::format("path calibration: a workload of the test migration of {} exited {}: {}", device,
                                  rc, PathRunTail(PathRunSlurp(child.err))));
    }
  }
  w.children.clear();
  return PathRunFromReport(PathRunSlurp(m.out), !large_final);
}

// The runs' security: none, or TLS 1.3 with a throwaway pre-shared key (the
// runs' TLS and AES-GCM cost what a real migration's do).
Result<std::vector<std::string>> RunSecurity(const PathConfig& c, const fs::path& dir) {
  if (c.transport == "insecure") return std::vector<std::string>{"--insecure-no-tls"};
  if (c.transport != "tls") {
    return InvalidArgument(fmt::format("path calibration: unknown transport '{}' (tls or insecure)", c.transport));
  }
  std::random_device rd;
  std::string hex;
  for (int i = 0; i < 32; ++i) hex += fmt::format("{:02x}", rd() & 0xff);
  const std::string psk = (dir / "psk").string();
  {
    std::ofstream f(psk);
    f << hex << "\n";
    if (!f) return Status::FromErrno(errno, fmt::format("path calibration: write {}", psk));
  }
  ::chmod(psk.c_str(), 0600);
  return std::vector<std::string>{"--psk-file", psk};
}

std::string RunMethod(const PathConfig& c) {
  return c.backend == "proc"
             ? fmt::format("2 migrations each of a gpumigrate-workload process ({}) and ({}) into an adopting one, "
                           "between two processes of this binary over loopback",
                           fmt::join(ProcCalibrationWorkload(c, false), " "),
                           fmt::join(ProcCalibrationWorkload(c, true), " "))
             : fmt::format("2 migrations each of {} and {} between two processes of this binary over loopback",
                           PathCalibrationDevice(c, false), PathCalibrationDevice(c, true));
}

}  // namespace

Result<PathCalibration> MeasurePath(const PathConfig& c, const PathRunPrograms& p) {
  if (p.gpumigrate.empty()) return InvalidArgument("path calibration: no gpumigrate binary to run");
  std::unique_ptr<Launcher> own;
  Launcher* l = p.launcher;
  if (l == nullptr) {
    own = MakeProcessLauncher();
    l = own.get();
  }
  std::error_code ec;
  Scratch s;
  s.dir = fs::temp_directory_path() / fmt::format("gpumigrate-pathcal-{}", getpid());
  fs::create_directories(s.dir, ec);
  if (ec) return Internal(fmt::format("path calibration: create {}: {}", s.dir.string(), ec.message()));
  GM_ASSIGN_OR_RETURN(std::vector<std::string> security, RunSecurity(c, s.dir));
  if (p.progress) {
    p.progress(fmt::format("calibrating the path {} (first use of this configuration): 4 migrations of {}{} and {} "
                           "between two processes...",
                           c.Key(), c.backend == "proc" ? "gpumigrate-workload processes of " : "",
                           FormatBytes(static_cast<double>(CalibrationBytes(c, false))),
                           FormatBytes(static_cast<double>(CalibrationBytes(c, true)))));
  }
  std::vector<PathRun> runs;
  for (int i = 0; i < 4; ++i) {
    GM_ASSIGN_OR_RETURN(PathRun r, OneRun(p, *l, c, i % 2 == 1, s.dir, security));
    runs.push_back(std::move(r));
  }
  GM_ASSIGN_OR_RETURN(PathCalibration cal, FitPathCalibration(c, runs));
  cal.measured_at = PathRunNowUtc();
  cal.method = RunMethod(c);
  return cal;
}

std::vector<std::string> ProcCalibrationWorkload(const PathConfig& c, bool large_final) {
  // Memory shared with gpumigrate (memfd), every page written first. The nearly
  // empty final round: a few pages a second, at random. The large one: a hot
  // twelfth of the pages rewritten at random at 200 MB/s, so every dirty round
  // and the final one carry megabytes of scattered 4 KiB pages, and the writer
  // takes its share of the cores as a busy process does.
  const uint64_t size = CalibrationBytes(c, large_final);
  std::vector<std::string> a{"--size", fmt::format("{}MiB", size >> 20), "--memory", "memfd", "--fill", "1"};
  if (large_final) {
    a.insert(a.end(), {"--rate", "200MB/s", "--pattern", "hot", "--hot", "0.083"});
  } else {
    a.insert(a.end(), {"--rate", "64KB/s"});
  }
  return a;
}

std::string PathCalibrationDevice(const PathConfig& c, bool large_final) {
  // The two kinds on two sizes (a quarter for the nearly empty final round):
  // round 0's startup and rate come from the pair. One decode step per 50 ms:
  // a faster sim burns a core rewriting its hot set and measures its own CPU
  // use, not the path's.
  const uint64_t size = CalibrationBytes(c, large_final);
  const uint64_t hot = large_final ? std::clamp<uint64_t>(size / 12, 2u << 20, 24u << 20) : 64u << 10;
  return fmt::format("sim:size={}MiB,static=0.85,kv=0.05,kv_fill=1,kv_rate=0,hot={}KiB,page=64KiB,step=50ms",
                     size >> 20, hot >> 10);
}

Status RecordAgainstPath(const PathCalibration& c, const MigrationReport& r) {
  GM_ASSIGN_OR_RETURN(PathRun run, PathRunFromReport(ReportToJson(r), false));
  auto o = ObservePath(c, run, PathRunNowUtc());
  if (!o) return Status::Ok();
  return RecordPathObservation(*o);
}

Result<PathCalibration> LoadOrMeasurePath(const PathConfig& c, bool force, const PathRunPrograms& p,
                                          bool* measured_now) {
  if (measured_now) *measured_now = false;
  if (!force) {
    auto stored = LoadPathCalibration(c);
    if (stored.ok() && stored->has_value()) return **stored;
    if (!stored.ok() && p.progress) p.progress(fmt::format("{}; measuring again", stored.status().message()));
  }
  GM_ASSIGN_OR_RETURN(PathCalibration cal, MeasurePath(c, p));
  GM_RETURN_IF_ERROR(StorePathCalibration(cal));
  if (measured_now) *measured_now = true;
  return cal;
}

}  // namespace gpumigrate
