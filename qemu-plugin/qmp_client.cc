// QmpClient: connection, handshake, commands matched by id, and the read loop
// that queues events. The helpers for the migration hook are in qmp_commands.cc.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include <fmt/format.h>

#include "gpumigrate/qemu/qmp.h"
#include "qemu-plugin/qmp_io.h"

namespace gpumigrate {

using qmp_io::Ready;
using json = nlohmann::json;

namespace {

std::string Ms(std::chrono::milliseconds d) { return fmt::format("{} ms", d.count()); }

// Field readers that never throw: a peer's message of the wrong shape reads as
// the default (nlohmann's own accessors throw on a type mismatch).
const json& Field(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}
int64_t IntOr(const json& obj, const char* key, int64_t otherwise) {
  const json& v = Field(obj, key);
  return v.is_number_integer() ? v.get<int64_t>() : otherwise;
}
std::string StrOr(const json& obj, const char* key, std::string otherwise) {
  const json& v = Field(obj, key);
  return v.is_string() ? v.get<std::string>() : otherwise;
}

// Every key of `subset` is in `value` with an equal value (objects recursively).
bool JsonContains(const json& value, const json& subset) {
  if (subset.is_null()) return true;
  if (!subset.is_object()) return value == subset;
  if (!value.is_object()) return false;
  for (const auto& [key, want] : subset.items()) {
    auto it = value.find(key);
    if (it == value.end() || !JsonContains(*it, want)) return false;
  }
  return true;
}

// QEMU's error reply as a Status naming the command, the class and the desc.
Status QemuError(std::string_view command, const json& error, std::string& error_class) {
  error_class = StrOr(error, "class", "?");
  std::string desc = error.is_object() ? StrOr(error, "desc", "") : error.dump();
  StatusCode code =
      error_class == "CommandNotFound" ? StatusCode::kUnimplemented : StatusCode::kFailedPrecondition;
  return Status(code, fmt::format("qmp: {} failed: QEMU error {}: {}", command, error_class, desc));
}

}  // namespace

QmpClient::QmpClient(std::string path, QmpOptions options) : path_(std::move(path)), options_(options) {
  cancel_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  closed_why_ = Unavailable("not connected");
}

QmpClient::~QmpClient() {
  Close();
  if (cancel_fd_ >= 0) close(cancel_fd_);
}

Result<std::unique_ptr<QmpClient>> QmpClient::Connect(std::string socket_path, QmpOptions options) {
  std::unique_ptr<QmpClient> c(new QmpClient(std::move(socket_path), options));
  if (c->cancel_fd_ < 0) return Status::FromErrno(errno, "qmp: eventfd failed");
  GM_RETURN_IF_ERROR(c->Open(std::chrono::steady_clock::now() + options.connect_timeout));
  return std::unique_ptr<QmpClient>(std::move(c));
}

Result<std::unique_ptr<QmpClient>> QmpClient::Adopt(int fd, QmpOptions options) {
  std::unique_ptr<QmpClient> c(new QmpClient("", options));
  c->fd_ = fd;  // owned from here: closed by Fail() or the destructor
  c->closed_why_ = Status::Ok();
  if (c->cancel_fd_ < 0) return Status::FromErrno(errno, "qmp: eventfd failed");
  GM_RETURN_IF_ERROR(c->Fail(qmp_io::PrepareFd(fd)));
  GM_RETURN_IF_ERROR(c->Handshake(std::chrono::steady_clock::now() + options.connect_timeout));
  return std::unique_ptr<QmpClient>(std::move(c));
}

Status QmpClient::Open(Deadline deadline) {
  Result<int> fd = qmp_io::ConnectUnix(path_, deadline);
  if (!fd.ok()) {
    closed_why_ = fd.status();
    return fd.status();
  }
  fd_ = *fd;
  closed_why_ = Status::Ok();
  return Handshake(deadline);
}

Status QmpClient::Handshake(Deadline deadline) {
  inbuf_.clear();
  // QEMU greets a client only once the one before it has gone (one client per chardev).
  Result<json> greeting = ReadMessage(deadline, "read the greeting");
  if (!greeting.ok()) {
    if (greeting.status().code() != StatusCode::kDeadlineExceeded) return Fail(greeting.status());
    return Fail(Status(StatusCode::kDeadlineExceeded,
                       fmt::format("qmp: read the greeting failed: none within {} ms on {} (QEMU serves one "
                                   "QMP client per socket: is another client connected?)",
                                   options_.connect_timeout.count(), path_.empty() ? "the adopted fd" : path_)));
  }
  const json& qmp = Field(*greeting, "QMP");
  if (!qmp.is_object()) {
    return Fail(Corrupt(fmt::format("qmp: read the greeting failed: not a QMP greeting: {}",
                                    greeting->dump().substr(0, 200))));
  }
  const json& v = Field(qmp, "version");
  const json& q = Field(v, "qemu");
  version_ = QemuVersion{static_cast<int>(IntOr(q, "major", 0)), static_cast<int>(IntOr(q, "minor", 0)),
                         static_cast<int>(IntOr(q, "micro", 0)), StrOr(v, "package", "")};
  const json& caps = Field(qmp, "capabilities");
  greeting_capabilities_ = caps.is_array() ? caps : json::array();
  auto left = std::chrono::milliseconds(std::max<int64_t>(qmp_io::MsLeft(deadline), 1));
  Result<json> r = Execute("qmp_capabilities", nullptr, left);
  return r.ok() ? Status::Ok() : Fail(r.status());
}

Status QmpClient::Reconnect() {
  if (path_.empty()) return FailedPrecondition("qmp: reconnect failed: the client adopted an fd and has no path");
  Close();
  uint64_t drained;
  while (read(cancel_fd_, &drained, sizeof drained) > 0) {
  }
  cancelled_ = false;
  last_error_class_.clear();
  return Open(std::chrono::steady_clock::now() + options_.connect_timeout);
}

void QmpClient::Close() {
  if (fd_ < 0) return;
  close(fd_);
  fd_ = -1;
  inbuf_.clear();
  if (closed_why_.ok()) closed_why_ = Unavailable("closed by the client");
}

void QmpClient::Cancel() {
  cancelled_ = true;
  uint64_t one = 1;
  if (cancel_fd_ >= 0 && write(cancel_fd_, &one, sizeof one) < 0) {
    // The counter is saturated: it is already readable, which is all we need.
  }
}

Status QmpClient::Fail(Status status) {
  if (status.ok()) return status;
  if (fd_ >= 0) {
    closed_why_ = status;
    close(fd_);
    fd_ = -1;
    inbuf_.clear();
  }
  return status;
}

Status QmpClient::Usable(std::string_view what) const {
  if (cancelled_) return Aborted(fmt::format("qmp: {} failed: cancelled", what));
  if (fd_ < 0) {
    return Unavailable(fmt::format("qmp: {} failed: not connected ({})", what, closed_why_.message()));
  }
  return Status::Ok();
}

QmpEvent QmpClient::RecordEvent(const json& message) {
  QmpEvent e;
  e.name = StrOr(message, "event", Field(message, "event").dump());
  const json& data = Field(message, "data");
  if (!data.is_null()) e.data = data;
  const json& ts = Field(message, "timestamp");
  e.qemu_time = std::chrono::seconds(IntOr(ts, "seconds", 0)) + std::chrono::microseconds(IntOr(ts, "microseconds", 0));
  e.received = options_.clock->Now();
  e.seq = ++next_event_seq_;
  log_.push_back(e);
  while (log_.size() > options_.max_logged_events) log_.pop_front();
  return e;
}

Result<json> QmpClient::ReadMessage(Deadline deadline, std::string_view what) {
  for (;;) {
    GM_RETURN_IF_ERROR(Usable(what));
    bool oversized = false;
    std::optional<std::string> line = qmp_io::PopLine(inbuf_, options_.max_line_bytes, oversized);
    if (oversized) {
      return Fail(Status(StatusCode::kResourceExhausted,
                         fmt::format("qmp: {} failed: a line from QEMU is longer than {} bytes", what,
                                     options_.max_line_bytes)));
    }
    if (line) {
      if (line->find_first_not_of(" \t\r") == std::string::npos) continue;
      json message = json::parse(*line, nullptr, /*allow_exceptions=*/false);
      if (message.is_discarded() || !message.is_object()) {
        return Fail(Corrupt(fmt::format("qmp: {} failed: malformed message from QEMU (not a JSON object): {}",
                                        what, line->substr(0, 200))));
      }
      return message;
    }
    GM_ASSIGN_OR_RETURN(Ready ready, qmp_io::WaitFor(fd_, POLLIN, cancel_fd_, deadline));
    if (ready == Ready::kCancelled) return Aborted(fmt::format("qmp: {} failed: cancelled", what));
    if (ready == Ready::kTimeout) return Status(StatusCode::kDeadlineExceeded, std::string(what));
    Result<ssize_t> n = qmp_io::ReadSome(fd_, inbuf_);
    if (!n.ok()) return Fail(n.status().WithContext(fmt::format("qmp: {} failed", what)));
    if (*n == 0) {
      return Fail(Unavailable(fmt::format("qmp: {} failed: QEMU closed the QMP socket{}{}", what,
                                          path_.empty() ? "" : " ", path_)));
    }
  }
}

Status QmpClient::SendCommand(std::string_view command, const json& arguments, const std::string& id,
                              Deadline deadline) {
  json request = {{"execute", command}, {"id", id}};
  if (!arguments.is_null()) {
    if (!arguments.is_object()) {
      return InvalidArgument(fmt::format("qmp: {} failed: arguments must be a JSON object", command));
    }
    request["arguments"] = arguments;
  }
  std::string line = request.dump() + "\n";
  return Fail(qmp_io::WriteAll(fd_, cancel_fd_, line, deadline, command));
}

Result<json> QmpClient::Execute(std::string_view command, const json& arguments, std::chrono::milliseconds timeout) {
  GM_RETURN_IF_ERROR(Usable(command));
  last_error_class_.clear();
  Deadline deadline = std::chrono::steady_clock::now() + timeout;
  std::string id = fmt::format("gm-{}", ++next_id_);
  Status sent = SendCommand(command, arguments, id, deadline);
  if (!sent.ok()) return sent;
  for (;;) {
    Result<json> m = ReadMessage(deadline, command);
    if (!m.ok()) {
      if (m.status().code() != StatusCode::kDeadlineExceeded) return m.status();
      return Status(StatusCode::kDeadlineExceeded,
                    fmt::format("qmp: {} failed: no reply from QEMU within {}", command, Ms(timeout)));
    }
    json& msg = *m;
    if (msg.contains("event")) {
      queue_.push_back(RecordEvent(msg));
      continue;
    }
    if (!msg.contains("return") && !msg.contains("error")) {
      return Fail(Corrupt(fmt::format("qmp: {} failed: unexpected message from QEMU: {}", command,
                                      msg.dump().substr(0, 200))));
    }
    // No id: QEMU could not parse the request far enough to see it; it answers ours.
    if (msg.contains("id") && msg["id"] != id) {
      ++stale_replies_;
      continue;
    }
    if (msg.contains("error")) return QemuError(command, msg["error"], last_error_class_);
    return std::move(msg["return"]);
  }
}

Result<QmpEvent> QmpClient::WaitEvent(const QmpEventMatch& match, std::chrono::milliseconds timeout,
                                      std::string_view what) {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (match(*it)) {
      QmpEvent e = std::move(*it);
      queue_.erase(it);
      return e;
    }
  }
  std::string action = fmt::format("wait for {}", what);
  Deadline deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    Result<json> m = ReadMessage(deadline, action);
    if (!m.ok()) {
      if (m.status().code() != StatusCode::kDeadlineExceeded) return m.status();
      return Status(StatusCode::kDeadlineExceeded,
                    fmt::format("qmp: {} failed: none within {} ({} other events queued)", action, Ms(timeout),
                                queue_.size()));
    }
    if (!m->contains("event")) {  // a reply to a command that had timed out
      ++stale_replies_;
      continue;
    }
    QmpEvent e = RecordEvent(*m);
    if (match(e)) return e;
    queue_.push_back(std::move(e));
  }
}

Result<QmpEvent> QmpClient::WaitEvent(std::string_view name, std::chrono::milliseconds timeout,
                                      const json& data_subset) {
  std::string what = data_subset.is_null() ? fmt::format("event {}", name)
                                           : fmt::format("event {} {}", name, data_subset.dump());
  std::string wanted(name);
  return WaitEvent([&](const QmpEvent& e) { return e.name == wanted && JsonContains(e.data, data_subset); },
                   timeout, what);
}

Status QmpClient::ReadEvents(std::chrono::milliseconds timeout) {
  Result<QmpEvent> none = WaitEvent([](const QmpEvent&) { return false; }, timeout, "events");
  if (none.status().code() == StatusCode::kDeadlineExceeded) return Status::Ok();
  return none.status();
}

std::deque<QmpEvent> QmpClient::TakeQueuedEvents() {
  std::deque<QmpEvent> out;
  out.swap(queue_);
  return out;
}

int QmpClient::peer_pid() const {
  if (fd_ < 0) return -1;
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd_, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0) return -1;
  return cred.pid;
}

}  // namespace gpumigrate
