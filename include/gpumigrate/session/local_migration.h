// A whole migration inside one process: source and destination devices joined
// by in-memory streams, the destination session on its own thread. Used by
// `gpumigrate demo`, the tests and the benchmarks.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "gpumigrate/devices/device.h"
#include "gpumigrate/session/session.h"
#include "gpumigrate/common/stream.h"

namespace gpumigrate {

struct LocalMigrationOptions {
  SourceOptions source;
  DestinationOptions destination;
  uint32_t data_streams = 1;
  size_t pipe_capacity_bytes = 8 << 20;
  // Optional: wraps the source's end of a stream (index -1 is the control
  // stream, 0.. the data streams), e.g. with a FaultStream. The wrapper owns it.
  std::function<std::unique_ptr<Stream>(std::unique_ptr<Stream>, int index)> wrap_source_end;
  // Optional: sees every stream end once they exist (source ends after wrapping),
  // e.g. so a phase hook can cut one. Pointers are valid until the call returns.
  std::function<void(const SessionStreams& source, const SessionStreams& destination)> on_streams;
};

struct LocalMigrationResult {
  MigrationReport source;
  MigrationReport destination;
};

LocalMigrationResult MigrateLocally(Device& source, Device& destination, const LocalMigrationOptions& options);

// The same, but over real sockets on 127.0.0.1: TCP data streams driven by
// io_uring and, with `tls`, a TLS 1.3 control channel keyed by an ephemeral
// pre-shared key and AES-256-GCM frames (what `gpumigrate demo` does by default).
// wrap_source_end and on_streams are not used. `security` receives what
// protected the session.
LocalMigrationResult MigrateOverLoopback(Device& source, Device& destination, const LocalMigrationOptions& options,
                                         bool tls, std::string* security);

}  // namespace gpumigrate
