#include "cli/path_calibration.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

#include "cli/print.h"
#include "gpumigrate/path_spread.h"
#include "gpumigrate/proc.h"
#include "gpumigrate/report.h"
#include "gpumigrate/units.h"

extern char** environ;

namespace gpumigrate::cli {
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

std::string NowUtc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// A child process whose stdout and stderr go to files.
struct Child {
  pid_t pid = -1;
  std::string out, err;
};

Result<Child> Spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  Child c{-1, out, err};
  const int rc = posix_spawn(&c.pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Status::FromErrno(rc, fmt::format("path calibration: start {}", args[0]));
  return c;
}

// Waits up to `limit`; a child still running then is killed. Returns its exit status (-1: killed).
int Wait(Child& c, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (true) {
    const pid_t r = waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0) return -1;
    if (std::chrono::steady_clock::now() >= until) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(20ms);
  }
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Tail(const std::string& text) {
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

// The workload processes of one proc run: killed (if still running) when it ends.
struct Workloads {
  std::vector<Child> children;
  ~Workloads() {
    for (auto& c : children) Wait(c, 0s);
  }
};

// Starts a gpumigrate-workload and waits up to 60 s for its shim's socket.
Result<Child> StartWorkload(const std::vector<std::string>& args, const fs::path& dir, const std::string& name,
                            Workloads& w) {
  GM_ASSIGN_OR_RETURN(Child c, Spawn(args, (dir / (name + ".out")).string(), (dir / (name + ".err")).string()));
  w.children.push_back(c);
  const std::string sock = ProcShimSocket(c.pid);
  for (int i = 0; i < 3000; ++i) {
    std::error_code ec;
    if (fs::exists(sock, ec)) return c;
    if (waitpid(c.pid, nullptr, WNOHANG) == c.pid) {
      w.children.pop_back();
      return Internal(fmt::format("path calibration: the {} workload exited before serving its shim: {}", name,
                                  Tail(Slurp(c.err))));
    }
    std::this_thread::sleep_for(20ms);
  }
  return Status{StatusCode::kDeadlineExceeded,
                fmt::format("path calibration: the {} workload did not serve its shim ({}) within 60 s", name, sock)};
}

// The device pair of one run: a sim spec on both sides, or for proc a source
// workload and an adopting destination started now.
struct RunDevices {
  std::string source, destination;
};

Result<RunDevices> StartDevices(const PathConfig& c, bool large_final, const fs::path& dir, Workloads& w) {
  if (c.backend != "proc") {
    const std::string d = PathCalibrationDevice(c, large_final);
    return RunDevices{d, d};
  }
  GM_ASSIGN_OR_RETURN(std::string wl, PathCalibrationWorkload());
  const std::vector<std::string> spec = ProcCalibrationWorkload(c, large_final);
  std::vector<std::string> src{wl};
  src.insert(src.end(), spec.begin(), spec.end());
  std::vector<std::string> dst = src;
  dst.insert(dst.end(), {"--adopt", "--adopt-timeout", "240s"});
  GM_ASSIGN_OR_RETURN(Child s, StartWorkload(src, dir, "source", w));
  GM_ASSIGN_OR_RETURN(Child d, StartWorkload(dst, dir, "destination", w));
  return RunDevices{fmt::format("proc:{}", s.pid), fmt::format("proc:{}", d.pid)};
}

Result<PathRun> OneRun(const std::string& self, const PathConfig& c, bool large_final, const fs::path& dir,
                       const std::vector<std::string>& security) {
  Workloads w;
  GM_ASSIGN_OR_RETURN(RunDevices devices, StartDevices(c, large_final, dir, w));
  const std::string& device = devices.source;
  const std::string port_file = (dir / "port").string();
  std::error_code ec;
  fs::remove(port_file, ec);
  std::vector<std::string> recv{self, "receive", "--listen", "127.0.0.1:0", "--port-file", port_file, "--device",
                                devices.destination, "--accept-timeout", "60s", "--json"};
  recv.insert(recv.end(), security.begin(), security.end());
  GM_ASSIGN_OR_RETURN(Child r, Spawn(recv, (dir / "recv.out").string(), (dir / "recv.err").string()));
  std::string port;
  for (int i = 0; i < 1500 && port.empty(); ++i) {  // up to 30 s for the receiver to listen
    std::ifstream in(port_file);
    if (in) in >> port;
    if (port.empty()) {
      if (waitpid(r.pid, nullptr, WNOHANG) == r.pid) {
        return Internal(fmt::format("path calibration: the receiver exited before listening: {}",
                                    Tail(Slurp(r.err))));
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  if (port.empty()) {
    Wait(r, 0s);
    return Status{StatusCode::kDeadlineExceeded, "path calibration: the receiver did not listen within 30 s"};
  }
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
  mig.insert(mig.end(), security.begin(), security.end());
  GM_ASSIGN_OR_RETURN(Child m, Spawn(mig, (dir / "mig.out").string(), (dir / "mig.err").string()));
  const int mrc = Wait(m, 180s);
  const int rrc = Wait(r, mrc == 0 ? 60s : 5s);
  if (mrc != 0 || rrc != 0) {
    return Internal(fmt::format("path calibration: a test migration of {} failed (migrate exit {}, receive exit {}): "
                                "{} {}",
                                device, mrc, rrc, Tail(Slurp(m.err)), Tail(Slurp(r.err))));
  }
  // A migrated source exits by itself; the destination checks the pages it
  // adopted and exits: a run whose workload finds its memory wrong failed.
  for (auto& child : w.children) {
    const int rc = Wait(child, 30s);
    if (rc != 0) {
      return Internal(fmt::format("path calibration: a workload of the test migration of {} exited {}: {}", device,
                                  rc, Tail(Slurp(child.err))));
    }
  }
  w.children.clear();
  return PathRunFromReport(Slurp(m.out), !large_final);
}

Result<PathCalibration> Measure(const PathConfig& c, FILE* progress) {
  std::error_code ec;
  const std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) return Internal(fmt::format("path calibration: cannot find this program: {}", ec.message()));
  Scratch s;
  s.dir = fs::temp_directory_path() / fmt::format("gpumigrate-pathcal-{}", getpid());
  fs::create_directories(s.dir, ec);
  if (ec) return Internal(fmt::format("path calibration: create {}: {}", s.dir.string(), ec.message()));
  std::vector<std::string> security;
  if (c.transport == "insecure") {
    security = {"--insecure-no-tls"};
  } else if (c.transport == "tls") {
    // A throwaway pre-shared key: the runs' TLS 1.3 and AES-GCM cost what a real migration's do.
    std::random_device rd;
    std::string hex;
    for (int i = 0; i < 32; ++i) hex += fmt::format("{:02x}", rd() & 0xff);
    const std::string psk = (s.dir / "psk").string();
    {
      std::ofstream f(psk);
      f << hex << "\n";
      if (!f) return Status::FromErrno(errno, fmt::format("path calibration: write {}", psk));
    }
    ::chmod(psk.c_str(), 0600);
    security = {"--psk-file", psk};
  } else {
    return InvalidArgument(fmt::format("path calibration: unknown transport '{}' (tls or insecure)", c.transport));
  }
  if (progress) {
    Print(progress, "calibrating the path {} (first use of this configuration): 4 migrations of {}{} and {} between "
                    "two processes...\n",
          c.Key(), c.backend == "proc" ? "gpumigrate-workload processes of " : "",
          FormatBytes(static_cast<double>(CalibrationBytes(c, false))),
          FormatBytes(static_cast<double>(CalibrationBytes(c, true))));
  }
  std::vector<PathRun> runs;
  for (int i = 0; i < 4; ++i) {
    GM_ASSIGN_OR_RETURN(PathRun r, OneRun(self, c, i % 2 == 1, s.dir, security));
    runs.push_back(std::move(r));
  }
  GM_ASSIGN_OR_RETURN(PathCalibration cal, FitPathCalibration(c, runs));
  cal.measured_at = NowUtc();
  cal.method = c.backend == "proc"
                   ? fmt::format("2 migrations each of a gpumigrate-workload process ({}) and ({}) into an adopting "
                                 "one, between two processes of this binary over loopback",
                                 fmt::join(ProcCalibrationWorkload(c, false), " "),
                                 fmt::join(ProcCalibrationWorkload(c, true), " "))
                   : fmt::format("2 migrations each of {} and {} between two processes of this binary over loopback",
                                 PathCalibrationDevice(c, false), PathCalibrationDevice(c, true));
  return cal;
}

}  // namespace

Result<std::string> PathCalibrationWorkload() {
  if (const char* e = std::getenv("GPUMIGRATE_WORKLOAD"); e && *e) {
    if (::access(e, X_OK) == 0) return std::string(e);
    return FailedPrecondition(fmt::format("$GPUMIGRATE_WORKLOAD {} is not an executable", e));
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  const fs::path beside = self.parent_path() / "gpumigrate-workload";
  if (!ec && ::access(beside.c_str(), X_OK) == 0) return beside.string();
  return FailedPrecondition(fmt::format("a proc device's calibration migrates gpumigrate-workload processes: none at {} and "
                              "no $GPUMIGRATE_WORKLOAD",
                              beside.string()));
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
  auto o = ObservePath(c, run, NowUtc());
  if (!o) return Status::Ok();
  return RecordPathObservation(*o);
}

Result<PathCalibration> LoadOrMeasurePath(const PathConfig& c, bool force, FILE* progress, bool* measured_now) {
  if (measured_now) *measured_now = false;
  if (!force) {
    auto stored = LoadPathCalibration(c);
    if (stored.ok() && stored->has_value()) return **stored;
    if (!stored.ok() && progress) Print(progress, "{}; measuring again\n", stored.status().message());
  }
  GM_ASSIGN_OR_RETURN(PathCalibration cal, Measure(c, progress));
  GM_RETURN_IF_ERROR(StorePathCalibration(cal));
  if (measured_now) *measured_now = true;
  return cal;
}

}  // namespace gpumigrate::cli
