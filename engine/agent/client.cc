// The controller's end of the agents' control channel: one request over mutual
// TLS, its reply bounded in time by a watchdog that closes the stream.
#include "engine/agent/client.h"

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "gpumigrate/agent/agent.h"
#include "transport/net/tcp.h"

namespace gpumigrate::agent {

namespace {

std::string Absolute(const std::string& p) { return std::filesystem::absolute(p).string(); }

class TlsClient final : public Client {
 public:
  explicit TlsClient(TlsFiles tls) : tls_(std::move(tls)) {}
  Result<Json> Call(const std::string& address, const Json& request, std::chrono::milliseconds timeout) override {
    return CallAgent(address, tls_, request, timeout);
  }

 private:
  TlsFiles tls_;
};

}  // namespace

TlsConfig TlsConfigOf(const TlsFiles& t) {
  TlsConfig c;
  c.ca_file = Absolute(t.ca);
  c.cert_file = Absolute(t.cert);
  c.key_file = Absolute(t.key);
  return c;
}

std::unique_ptr<Client> MakeTlsClient(TlsFiles tls) { return std::make_unique<TlsClient>(std::move(tls)); }

Result<Json> CallAgent(const std::string& address, const TlsFiles& t, const Json& request,
                       std::chrono::milliseconds ms) {
  auto to = ParseHostPort(address);
  if (!to.ok()) return to.status();
  TlsConfig tls = TlsConfigOf(t);
  tls.expected_host = to->host;
  if (std::string p = tls.Problem(); !p.empty()) return InvalidArgument(p);
  auto fd = ConnectTcpFd(*to, ms);
  if (!fd.ok()) return Unavailable(fmt::format("{}: {}", address, fd.status().message()));
  auto stream = TlsStream::Client(*fd, tls, ms);
  if (!stream.ok()) return Unavailable(fmt::format("{}: {}", address, stream.status().message()));
  // The reply is bounded: a watchdog closes the stream.
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, ms, [&] { return finished; })) (*stream)->Close();
  });
  Status sent = WriteMessage(**stream, request);
  Result<Json> reply = sent.ok() ? ReadMessage(**stream) : Result<Json>(sent);
  {
    std::lock_guard<std::mutex> lock(mu);
    finished = true;
  }
  cv.notify_all();
  watchdog.join();
  (*stream)->Close();
  if (!reply.ok()) {
    return Unavailable(fmt::format("{}: no reply to {} within {} ms: {}", address, request.value("op", "?"),
                                   ms.count(), reply.status().message()));
  }
  return reply;
}

namespace {

constexpr Op kOps[] = {Op::kInventory, Op::kStatus,       Op::kReceive, Op::kMigrate,  Op::kPace,       Op::kCancel,
                       Op::kStartReplica, Op::kDrain, Op::kPowerOff, Op::kResolve, Op::kMaintenance};

}  // namespace

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kInventory:
      return "inventory";
    case Op::kStatus:
      return "status";
    case Op::kReceive:
      return "receive";
    case Op::kMigrate:
      return "migrate";
    case Op::kPace:
      return "pace";
    case Op::kCancel:
      return "cancel";
    case Op::kStartReplica:
      return "start-replica";
    case Op::kDrain:
      return "drain";
    case Op::kPowerOff:
      return "power-off";
    case Op::kResolve:
      return "resolve";
    case Op::kMaintenance:
      break;
  }
  return "maintenance";
}

std::optional<Op> ParseOp(std::string_view name) {
  for (Op op : kOps) {
    if (name == OpName(op)) return op;
  }
  return std::nullopt;
}

Json Request(Op op, Json body) {
  body["op"] = OpName(op);
  return body;
}

std::string_view JobStateName(JobState s) {
  switch (s) {
    case JobState::kRunning:
      return "running";
    case JobState::kCompleted:
      return "completed";
    case JobState::kFailed:
      return "failed";
    case JobState::kInDoubt:
      return "in-doubt";
    case JobState::kLost:
      break;
  }
  return "lost";
}

std::optional<JobState> ParseJobState(std::string_view name) {
  for (JobState s : {JobState::kRunning, JobState::kCompleted, JobState::kFailed, JobState::kInDoubt, JobState::kLost}) {
    if (name == JobStateName(s)) return s;
  }
  return std::nullopt;
}

std::string_view RefusalCodeName(RefusalCode code) {
  switch (code) {
    case RefusalCode::kBusy:
      return "busy";
    case RefusalCode::kVmInJob:
      return "vm-in-job";
    case RefusalCode::kNotPaced:
      return "not-paced";
    case RefusalCode::kOther:
      break;
  }
  return "";
}

RefusalCode RefusalCodeOf(const Json& reply) {
  if (!reply.is_object() || !reply.contains("code") || !reply["code"].is_string()) return RefusalCode::kOther;
  const std::string code = reply["code"].get<std::string>();
  for (RefusalCode c : {RefusalCode::kBusy, RefusalCode::kVmInJob, RefusalCode::kNotPaced}) {
    if (code == RefusalCodeName(c)) return c;
  }
  return RefusalCode::kOther;
}

}  // namespace gpumigrate::agent
