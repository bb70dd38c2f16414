// The socket side of the QMP client: connecting to a UNIX socket, waiting on it
// with a deadline (and a cancel eventfd beside it), writing a whole line, and
// cutting the bytes read into lines. No JSON here.
//
// All waits are poll() on real time (std::chrono::steady_clock). The fds are
// non-blocking, so a peer that stops reading cannot hold a write past its
// deadline either.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gpumigrate/common/status.h"

namespace gpumigrate::qmp_io {

using Deadline = std::chrono::steady_clock::time_point;

// Milliseconds left until `deadline` (0 when past), for messages and poll().
int64_t MsLeft(Deadline deadline);

// Connects a non-blocking stream socket to `path`. A socket that is not there
// yet or refuses (QEMU still starting) is tried again every 10 ms until the
// deadline; other errors fail at once.
Result<int> ConnectUnix(const std::string& path, Deadline deadline);

// Makes `fd` non-blocking and close-on-exec.
Status PrepareFd(int fd);

enum class Ready { kReady, kTimeout, kCancelled };
// Waits until `fd` has `events` (POLLIN or POLLOUT; a hang-up counts as ready,
// the read or write then says what happened), the deadline passes, or
// `cancel_fd` becomes readable.
Result<Ready> WaitFor(int fd, short events, int cancel_fd, Deadline deadline);

// Appends what can be read now to `buf`: the byte count, 0 when the peer
// closed, or an error. EAGAIN reads as -1 ("nothing yet").
Result<ssize_t> ReadSome(int fd, std::string& buf);

// Writes all of `data` before the deadline (MSG_NOSIGNAL: a closed peer is an
// error, not SIGPIPE). `what` names the command in errors.
Status WriteAll(int fd, int cancel_fd, std::string_view data, Deadline deadline, std::string_view what);

// Takes the first complete line (without "\n" or "\r\n") off the front of `buf`.
// nullopt when there is none yet. Sets `oversized` when no line ends within
// `max_line_bytes` (the line would never fit).
std::optional<std::string> PopLine(std::string& buf, size_t max_line_bytes, bool& oversized);

}  // namespace gpumigrate::qmp_io
