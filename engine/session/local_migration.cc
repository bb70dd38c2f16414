#include "gpumigrate/session/local_migration.h"

#include <thread>

#include <fmt/format.h>

namespace gpumigrate {

LocalMigrationResult MigrateLocally(Device& source, Device& destination, const LocalMigrationOptions& options) {
  std::vector<std::unique_ptr<Stream>> src_owned, dst_owned;
  SessionStreams src, dst;
  for (int i = -1; i < static_cast<int>(options.data_streams); ++i) {
    auto [a, b] = MakePipe(i < 0 ? std::string("control") : fmt::format("data{}", i), options.pipe_capacity_bytes);
    if (options.wrap_source_end) a = options.wrap_source_end(std::move(a), i);
    if (i < 0) {
      src.control = a.get();
      dst.control = b.get();
    } else {
      src.data.push_back(a.get());
      dst.data.push_back(b.get());
    }
    src_owned.push_back(std::move(a));
    dst_owned.push_back(std::move(b));
  }
  if (options.on_streams) options.on_streams(src, dst);
  LocalMigrationResult result;
  std::thread dest_thread([&] { result.destination = RunDestination(destination, dst, options.destination); });
  result.source = RunSource(source, src, options.source);
  dest_thread.join();
  return result;
}

}  // namespace gpumigrate
