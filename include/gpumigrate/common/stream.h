// Stream: an ordered, reliable byte stream (a TCP connection, a file, a pipe).
//
// WriteAll() returns when every byte has been handed to the stream; the caller's
// buffer may be reused then. ReadExact() fills the whole buffer or fails:
// kUnavailable when the peer closed or the stream was cut, with how many bytes
// had arrived. Close() is like closing a socket: the peer still reads what was
// written before it, then end-of-stream; every other pending or later call on
// either end fails promptly (used to abort a migration). Safe from any thread. One reader thread and
// one writer thread may use a stream at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

class Stream {
 public:
  virtual ~Stream() = default;
  virtual std::string Name() const = 0;
  virtual Status WriteAll(std::span<const std::byte> data) = 0;
  virtual Status ReadExact(std::span<std::byte> out) = 0;
  // Reads what has arrived: at least one byte (it waits only for the first),
  // at most out.size(); 0 at the end of the stream. Streams that cannot
  // (the default) answer kUnimplemented: read them with ReadExact. One call
  // instead of several for a run of small reads (StreamReader).
  virtual Result<size_t> ReadSome(std::span<std::byte> out) {
    (void)out;
    return Unimplemented(Name() + ": no ReadSome");
  }
  virtual void Close() = 0;
  // An abortive Close(): what was written and not yet delivered is dropped, so
  // a migration given up on a slow link does not leave megabytes queued ahead
  // of its Abort (TCP: a reset). Pending calls on either end fail promptly.
  // Where a stream cannot drop its buffer this is Close().
  virtual void Reset() { Close(); }
  // Bytes written that the peer has acknowledged (TCP: tcpi_bytes_acked), as a
  // measure of what the link carried rather than what local buffers took;
  // nullopt where the stream cannot tell (pipes, files, wrappers). Any thread.
  virtual std::optional<uint64_t> BytesDelivered() const { return std::nullopt; }
  // Bytes written that wait in the stream's own buffer for the link to take them
  // (TCP: tcpi_notsent_bytes, written but not yet sent: the congestion or the
  // peer's window holds them back); nullopt where the stream cannot tell. Any thread.
  virtual std::optional<uint64_t> BytesUnsent() const { return std::nullopt; }
};

// A connected pair of in-memory streams (what one writes the other reads), with
// at most `capacity_bytes` buffered in each direction, so a slow reader applies
// backpressure to the writer as a socket would.
// The streams one migration session runs on: a control stream and the data
// streams (transport/net joins them; the session runs over them).
struct SessionStreams {
  Stream* control = nullptr;    // borrowed
  std::vector<Stream*> data;    // borrowed; at least one
};

std::pair<std::unique_ptr<Stream>, std::unique_ptr<Stream>> MakePipe(std::string name,
                                                                     size_t capacity_bytes = 4 << 20);

}  // namespace gpumigrate
