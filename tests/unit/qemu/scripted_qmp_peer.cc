#include "tests/unit/qemu/scripted_qmp_peer.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace gpumigrate::testing {

using json = nlohmann::json;

FakeQemuIo::~FakeQemuIo() { Close(); }

void FakeQemuIo::Fail(std::string why) {
  std::lock_guard<std::mutex> lock(record_->mu);
  record_->failures.push_back(std::move(why));
}

void FakeQemuIo::Send(std::string_view raw) {
  while (!raw.empty()) {
    ssize_t n = send(fd_, raw.data(), raw.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Fail("peer: send failed");
      return;
    }
    raw.remove_prefix(static_cast<size_t>(n));
  }
}

void FakeQemuIo::Greet(int major, int minor, int micro) {
  SendLine({{"QMP",
             {{"version", {{"qemu", {{"micro", micro}, {"minor", minor}, {"major", major}}}, {"package", "test"}}},
              {"capabilities", {"oob"}}}}});
}

json FakeQemuIo::Expect(std::string_view command) {
  auto deadline = std::chrono::steady_clock::now() + kPeerTimeout;
  for (;;) {
    size_t nl = buf_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      json request = json::parse(line, nullptr, false);
      {
        std::lock_guard<std::mutex> lock(record_->mu);
        record_->commands.push_back(request);
      }
      if (!request.is_object() || !request.contains("execute") || request["execute"] != command) {
        Fail("peer: expected " + std::string(command) + ", got " + line);
      }
      return request;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      Fail("peer: no " + std::string(command) + " within the peer timeout");
      return json();
    }
    char chunk[4096];
    ssize_t n = read(fd_, chunk, sizeof chunk);
    if (n <= 0) {
      Fail("peer: client closed while " + std::string(command) + " was expected");
      return json();
    }
    buf_.append(chunk, static_cast<size_t>(n));
  }
}

void FakeQemuIo::Return(const json& request, const json& value) {
  json reply = {{"return", value}};
  if (request.is_object() && request.contains("id")) reply["id"] = request["id"];
  SendLine(reply);
}

void FakeQemuIo::Error(const json& request, std::string_view error_class, std::string_view desc) {
  json reply = {{"error", {{"class", error_class}, {"desc", desc}}}};
  if (request.is_object() && request.contains("id")) reply["id"] = request["id"];
  SendLine(reply);
}

void FakeQemuIo::Event(std::string_view name, const json& data, int64_t seconds, int64_t micros) {
  SendLine({{"timestamp", {{"seconds", seconds}, {"microseconds", micros}}}, {"event", name}, {"data", data}});
}

void FakeQemuIo::Handshake() {
  Greet();
  json caps = Expect("qmp_capabilities");
  Return(caps, json::object());
}

void FakeQemuIo::DrainUntilClosed() {
  auto deadline = std::chrono::steady_clock::now() + kPeerTimeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      Fail("peer: the client did not close within the peer timeout");
      return;
    }
    char chunk[4096];
    if (read(fd_, chunk, sizeof chunk) <= 0) return;
  }
}

void FakeQemuIo::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

ScriptedQmpPeer::ScriptedQmpPeer(Script script) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    record_.failures.push_back("peer: socketpair failed");
    return;
  }
  client_fd_ = fds[0];
  thread_ = std::thread([this, fd = fds[1], script = std::move(script)] {
    FakeQemuIo io(fd, &record_);
    script(io);
  });
}

ScriptedQmpPeer::~ScriptedQmpPeer() {
  Join();
  if (client_fd_ >= 0) close(client_fd_);
}

int ScriptedQmpPeer::TakeClientFd() {
  int fd = client_fd_;
  client_fd_ = -1;
  return fd;
}

void ScriptedQmpPeer::Join() {
  if (thread_.joinable()) thread_.join();
}

std::vector<std::string> ScriptedQmpPeer::failures() {
  std::lock_guard<std::mutex> lock(record_.mu);
  return record_.failures;
}

std::vector<json> ScriptedQmpPeer::commands() {
  std::lock_guard<std::mutex> lock(record_.mu);
  return record_.commands;
}

}  // namespace gpumigrate::testing
