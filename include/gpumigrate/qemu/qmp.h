// QmpClient: a client for QEMU's machine protocol (QMP) on a UNIX socket, the
// control path of the QEMU migration hook (docs/design.md "Layers and folders").
//
// QMP is newline-delimited JSON objects (QEMU ends each with "\r\n"):
//
//   client                                      QEMU (-qmp unix:PATH,server=on,wait=off)
//     connect ───────────────────────────────▶
//             ◀── {"QMP":{"version":{"qemu":{"major":7,...}},"capabilities":[...]}}
//     {"execute":"qmp_capabilities","id":"gm-1"} ─▶
//             ◀── {"return":{},"id":"gm-1"}
//     {"execute":"migrate","arguments":{...},"id":"gm-2"} ─▶
//             ◀── {"event":"MIGRATION","data":{"status":"setup"},"timestamp":{...}}
//             ◀── {"return":{},"id":"gm-2"}
//             ◀── {"event":"STOP",...}   (any time, also while no command is out)
//
// Every command carries an "id" and its reply is matched by it: a reply that
// comes after its command timed out is recognised by its id and dropped, so it
// can never be taken for the answer to a later command. Events that arrive while
// a reply is awaited (before it or between replies) are queued, never lost, and
// every event received is also kept, in arrival order, in EventLog(), so a caller
// can compute e.g. STOP -> RESUME afterwards.
//
// Errors (messages read "qmp: <command> failed: <cause>"):
//   QEMU's {"error":{"class":C,"desc":D}}  kUnimplemented for CommandNotFound,
//                                          else kFailedPrecondition; the message
//                                          names the command, C and D, and
//                                          last_error_class() returns C
//   no reply within the timeout            kDeadlineExceeded (connection stays usable)
//   Cancel() from another thread           kAborted until Reconnect()
//   QEMU closed the socket                 kUnavailable, "QEMU closed the QMP socket ..."
//   malformed JSON, a line that is not an  kCorrupt / kResourceExhausted: the
//   object, a line over max_line_bytes     stream is no longer trusted and is closed
// After the connection is closed (by QEMU, by an error, or Close()) every call
// returns kUnavailable naming why, until Reconnect().
//
// One client per socket: QEMU serves one QMP client per -qmp chardev at a time.
// A second connection is accepted by the kernel but gets no greeting until the
// first closes, so Connect() against a socket someone else holds fails with a
// greeting timeout that says so. Reconnect() closes this client's connection
// first, then opens the same path again and renegotiates.
//
// Thread safety: a QmpClient is owned by one thread, which makes every call
// (reads use poll() with the call's timeout on the socket; nothing runs in the
// background). The one exception is Cancel(), which any thread may call while
// the owner is blocked: the owner's wait returns kAborted promptly.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumigrate/common/clock.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

inline constexpr std::chrono::milliseconds kQmpDefaultTimeout{10000};

struct QemuVersion {
  int major = 0;
  int minor = 0;
  int micro = 0;
  std::string package;  // e.g. "Debian 1:7.2+dfsg-7+deb12u18+b3"; may be empty
};

struct QmpEvent {
  std::string name;                         // "MIGRATION", "STOP", "RESUME", ...
  nlohmann::json data = nlohmann::json::object();  // the event's "data"; {} when none
  // QEMU's "timestamp": its wall clock (since the Unix epoch) when it emitted the
  // event; zero when the event had none.
  std::chrono::microseconds qemu_time{0};
  Clock::TimePoint received{};  // the client's Clock when the line was read
  uint64_t seq = 0;             // arrival order on this client, from 1, across reconnects
};

struct QmpOptions {
  // How long Connect()/Reconnect() keep trying a socket that is not there yet
  // (ENOENT, ECONNREFUSED: QEMU still starting) and wait for the greeting and the
  // capabilities reply.
  std::chrono::milliseconds connect_timeout{5000};
  // A line (one JSON message) longer than this is a broken peer, not a reply.
  size_t max_line_bytes = 16u << 20;
  // EventLog() keeps at most this many events; the oldest go first.
  size_t max_logged_events = 100000;
  // Stamps QmpEvent::received. Waits use poll() and so real time whatever this is.
  Clock* clock = &SystemClock();
};

// query-status.
struct QmpRunState {
  std::string status;  // QEMU's RunState: "running", "paused", "inmigrate", "postmigrate", ...
  bool running = false;
};

using QmpEventMatch = std::function<bool(const QmpEvent&)>;

class QmpClient {
 public:
  // Connects to the QMP socket at `socket_path`, reads the greeting and sends
  // qmp_capabilities.
  static Result<std::unique_ptr<QmpClient>> Connect(std::string socket_path, QmpOptions options = {});
  // The same over an already connected stream socket, which the client owns
  // from here on (closed on failure too). Reconnect() is refused: no path.
  static Result<std::unique_ptr<QmpClient>> Adopt(int fd, QmpOptions options = {});

  ~QmpClient();
  QmpClient(const QmpClient&) = delete;
  QmpClient& operator=(const QmpClient&) = delete;

  // From the greeting of the current connection.
  const QemuVersion& version() const { return version_; }
  const nlohmann::json& greeting_capabilities() const { return greeting_capabilities_; }
  const std::string& socket_path() const { return path_; }
  bool connected() const { return fd_ >= 0; }
  // The pid of the process serving the socket (SO_PEERCRED), or -1 when unknown.
  int peer_pid() const;

  // Runs `command` and returns its "return" value. `arguments` is sent when it
  // is not null (it must then be an object).
  Result<nlohmann::json> Execute(std::string_view command, const nlohmann::json& arguments = nullptr,
                                 std::chrono::milliseconds timeout = kQmpDefaultTimeout);
  // QEMU's error class of the last Execute that QEMU refused ("" otherwise).
  const std::string& last_error_class() const { return last_error_class_; }

  // The oldest queued event that matches, else the next matching one to arrive
  // within `timeout` (0: only what is queued or already readable). Events that
  // do not match stay queued, in order. `what` names the wait in the error.
  Result<QmpEvent> WaitEvent(const QmpEventMatch& match, std::chrono::milliseconds timeout,
                             std::string_view what = "matching event");
  // An event named `name` whose data contains `data_subset` (every key of it,
  // recursively, with an equal value; null matches any data).
  Result<QmpEvent> WaitEvent(std::string_view name, std::chrono::milliseconds timeout,
                             const nlohmann::json& data_subset = nullptr);
  // Reads what arrives within `timeout` (0: what is readable now) and queues its
  // events. OK when the time ran out; an error when the connection failed.
  Status ReadEvents(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // Queued events (not yet returned by WaitEvent), oldest first.
  const std::deque<QmpEvent>& queued_events() const { return queue_; }
  std::deque<QmpEvent> TakeQueuedEvents();
  // Every event received (also those WaitEvent returned), oldest first.
  const std::deque<QmpEvent>& event_log() const { return log_; }
  void ClearEventLog() { log_.clear(); }
  // Replies that came for commands which had already timed out, and were dropped.
  uint64_t stale_replies() const { return stale_replies_; }

  // Closes the connection and opens `socket_path` again (greeting, capabilities).
  // Whatever was unread on the old connection, including replies still owed to
  // timed-out commands, is dropped; queued events and the log stay. Clears a
  // Cancel().
  Status Reconnect();
  // Closes the connection (owner thread). Later calls return kUnavailable.
  void Close();
  // Any thread: the owner's current or next wait returns kAborted, until Reconnect().
  void Cancel();

  // Thin helpers for the migration hook (docs/qemu-facts.md §1-2).
  // {"capabilities":[{"capability":name,"state":on},...]}
  Status SetMigrationCapabilities(const std::vector<std::pair<std::string, bool>>& capabilities,
                                  std::chrono::milliseconds timeout = kQmpDefaultTimeout);
  Status SetMigrationParameters(const nlohmann::json& parameters,
                                std::chrono::milliseconds timeout = kQmpDefaultTimeout);
  Result<nlohmann::json> QueryMigrate(std::chrono::milliseconds timeout = kQmpDefaultTimeout);
  Result<QmpRunState> QueryStatus(std::chrono::milliseconds timeout = kQmpDefaultTimeout);
  Status MigrateIncoming(std::string_view uri, std::chrono::milliseconds timeout = kQmpDefaultTimeout);
  Status Migrate(std::string_view uri, std::chrono::milliseconds timeout = kQmpDefaultTimeout);
  Status MigrateContinue(std::string_view state = "pre-switchover",
                         std::chrono::milliseconds timeout = kQmpDefaultTimeout);
  Status MigrateCancel(std::chrono::milliseconds timeout = kQmpDefaultTimeout);
  Status Cont(std::chrono::milliseconds timeout = kQmpDefaultTimeout);
  // human-monitor-command: the HMP text output ("info status" -> "VM status: running\r\n").
  Result<std::string> HumanMonitorCommand(std::string_view command_line,
                                          std::chrono::milliseconds timeout = kQmpDefaultTimeout);

 private:
  using Deadline = std::chrono::steady_clock::time_point;
  QmpClient(std::string path, QmpOptions options);

  Status Open(Deadline deadline);
  Status Handshake(Deadline deadline);
  // The next JSON object from QEMU; an event is logged and returned as well.
  Result<nlohmann::json> ReadMessage(Deadline deadline, std::string_view what);
  Status Usable(std::string_view what) const;
  Status Fail(Status status);  // closes the connection and remembers why
  QmpEvent RecordEvent(const nlohmann::json& message);
  Status SendCommand(std::string_view command, const nlohmann::json& arguments, const std::string& id,
                     Deadline deadline);

  std::string path_;
  QmpOptions options_;
  int fd_ = -1;
  int cancel_fd_ = -1;  // eventfd, written by Cancel(); lives as long as the client
  std::atomic<bool> cancelled_{false};
  std::string inbuf_;   // bytes read but not yet split into lines
  Status closed_why_;   // why fd_ is closed (OK while open)
  QemuVersion version_;
  nlohmann::json greeting_capabilities_ = nlohmann::json::array();
  std::string last_error_class_;
  uint64_t next_id_ = 0;
  uint64_t next_event_seq_ = 0;
  uint64_t stale_replies_ = 0;
  std::deque<QmpEvent> queue_;
  std::deque<QmpEvent> log_;
};

}  // namespace gpumigrate
