// A scripted QEMU for the QMP client's tests: a thread that holds the far end
// of a socketpair and runs a script of what QEMU would read and write. The
// script checks the commands it receives (Expect) and records a failure for
// each surprise, which the test asserts on after Join(); it never blocks for
// longer than kPeerTimeout on a read, so a broken client fails a test instead
// of hanging it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/qemu/qmp.h"

namespace gpumigrate::testing {

inline constexpr std::chrono::milliseconds kPeerTimeout{3000};
// A client's bounds: generous against a slow machine, small against a hang.
inline constexpr std::chrono::milliseconds kSlack{2000};
inline constexpr std::chrono::milliseconds kShort{150};

// Shared by the peer thread and the test; locked.
struct PeerRecord {
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<nlohmann::json> commands;  // every request received, in order
};

// QEMU's side of one connection. Owns `fd`.
class FakeQemuIo {
 public:
  FakeQemuIo(int fd, PeerRecord* record) : fd_(fd), record_(record) {}
  ~FakeQemuIo();
  FakeQemuIo(const FakeQemuIo&) = delete;
  FakeQemuIo& operator=(const FakeQemuIo&) = delete;

  void Send(std::string_view raw);  // exactly these bytes, in one write
  void SendLine(const nlohmann::json& message) { Send(message.dump() + "\r\n"); }
  void Greet(int major = 7, int minor = 2, int micro = 22);
  // Reads the next request; records a failure unless it executes `command`.
  nlohmann::json Expect(std::string_view command);
  void Return(const nlohmann::json& request, const nlohmann::json& value);
  void Error(const nlohmann::json& request, std::string_view error_class, std::string_view desc);
  void Event(std::string_view name, const nlohmann::json& data, int64_t seconds = 1700000000, int64_t micros = 0);
  // Greet, then answer qmp_capabilities.
  void Handshake();
  // Reads until the client closes (or kPeerTimeout): QEMU that never answers.
  void DrainUntilClosed();
  void Close();
  void Fail(std::string why);

 private:
  int fd_;
  PeerRecord* record_;
  std::string buf_;
};

class ScriptedQmpPeer {
 public:
  using Script = std::function<void(FakeQemuIo&)>;
  explicit ScriptedQmpPeer(Script script);
  ~ScriptedQmpPeer();

  // The client's end, for QmpClient::Adopt (which takes ownership).
  int TakeClientFd();
  void Join();
  // After Join().
  std::vector<std::string> failures();
  std::vector<nlohmann::json> commands();

 private:
  PeerRecord record_;
  int client_fd_ = -1;
  std::thread thread_;
};

// The client over the peer's socketpair, or nullptr (and a test failure).
inline std::unique_ptr<QmpClient> AdoptOrDie(ScriptedQmpPeer& peer, QmpOptions options = {}) {
  auto c = QmpClient::Adopt(peer.TakeClientFd(), options);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

}  // namespace gpumigrate::testing
