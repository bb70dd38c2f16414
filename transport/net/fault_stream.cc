#include "transport/net/fault_stream.h"

#include <vector>

#include <fmt/format.h>

namespace gpumigrate {

Status FaultStream::WriteAll(std::span<const std::byte> data) {
  if (blackhole_.load()) return Status::Ok();
  uint64_t start = written_.load();
  uint64_t end = start + data.size();
  if (plan_.cut_at_byte && *plan_.cut_at_byte < end) {
    uint64_t keep = *plan_.cut_at_byte > start ? *plan_.cut_at_byte - start : 0;
    if (keep > 0) {
      GM_RETURN_IF_ERROR(inner_->WriteAll(data.first(keep)));
    }
    written_ += keep;
    inner_->Close();
    return Unavailable(fmt::format("{}: write failed: connection cut at byte {} (fault injection)", Name(),
                                   *plan_.cut_at_byte));
  }
  if (plan_.flip_at_byte && *plan_.flip_at_byte >= start && *plan_.flip_at_byte < end) {
    std::vector<std::byte> copy(data.begin(), data.end());
    copy[*plan_.flip_at_byte - start] ^= std::byte{0x01};
    written_ += data.size();
    return inner_->WriteAll(copy);
  }
  written_ += data.size();
  return inner_->WriteAll(data);
}

}  // namespace gpumigrate
