#include "gpumigrate/evacuation/evacuation_events.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace gpumigrate {

Result<std::unique_ptr<EvacuationEvents>> EvacuationEvents::Open(const std::string& where, std::string evacuation,
                                                                 std::string host) {
  if (where == "-") {
    return std::unique_ptr<EvacuationEvents>(new EvacuationEvents(stdout, false, std::move(evacuation), std::move(host)));
  }
  std::FILE* f = std::fopen(where.c_str(), "ae");
  if (f == nullptr) return Unavailable(fmt::format("--events: cannot open {}: {}", where, std::strerror(errno)));
  return std::unique_ptr<EvacuationEvents>(new EvacuationEvents(f, true, std::move(evacuation), std::move(host)));
}

EvacuationEvents::~EvacuationEvents() {
  if (owned_) std::fclose(f_);
}

void EvacuationEvents::Emit(std::string_view event, const nlohmann::ordered_json& fields) {
  nlohmann::ordered_json e;
  e["v"] = kEvacuationEventsVersion;
  e["seq"] = ++seq_;
  e["time_unix_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  e["evacuation"] = evacuation_;
  e["host"] = host_;
  e["event"] = std::string(event);
  if (fields.is_object()) {
    for (const auto& [k, v] : fields.items()) e[k] = v;
  }
  const std::string line = e.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::fwrite(line.data(), 1, line.size(), f_);
  std::fflush(f_);  // a follower sees each event as it happens
}

}  // namespace gpumigrate
