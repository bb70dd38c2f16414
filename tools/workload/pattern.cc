#include "tools/workload/pattern.h"

#include <cstring>

#include <fmt/format.h>

namespace gpumigrate::workload {
namespace {

uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct Head {
  uint32_t magic;
  uint32_t index;
  uint64_t version;
};

constexpr uint32_t kStateMagic = 0x54534d47;  // "GMST"

}  // namespace

void FillPage(std::span<std::byte> page, uint64_t seed, uint32_t index, uint32_t version) {
  Head h{kPageMagic, index, version};
  std::memcpy(page.data(), &h, sizeof(h));
  uint64_t x = seed ^ (uint64_t{index} << 32) ^ version;
  for (size_t off = sizeof(h); off + 8 <= page.size(); off += 8) {
    uint64_t v = SplitMix(x);
    std::memcpy(page.data() + off, &v, 8);
  }
}

std::string CheckPage(std::span<const std::byte> page, uint64_t seed, uint32_t index, uint32_t version) {
  if (version == 0) {
    for (std::byte b : page) {
      if (b != std::byte{0}) return "expected a page never written (zeros), found data";
    }
    return {};
  }
  Head h;
  std::memcpy(&h, page.data(), sizeof(h));
  if (h.magic == 0 && h.index == 0 && h.version == 0) return fmt::format("expected version {}, found zeros", version);
  if (h.magic != kPageMagic) return fmt::format("expected version {}, found no page header", version);
  if (h.index != index) return fmt::format("holds page {}'s data (misplaced)", h.index);
  if (h.version != version) {
    return fmt::format("expected version {}, found version {} ({})", version, h.version,
                       h.version < version ? "stale: a write was missed" : "newer than the state says");
  }
  std::vector<std::byte> want(page.size());
  FillPage(want, seed, index, version);
  if (std::memcmp(want.data(), page.data(), page.size()) != 0) return fmt::format("version {} with a corrupt body", version);
  return {};
}

std::vector<std::byte> State::Serialize() const {
  std::vector<std::byte> out(32 + versions.size() * 4);
  uint32_t magic = kStateMagic;
  uint32_t count = static_cast<uint32_t>(versions.size());
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &page_size, 4);
  std::memcpy(out.data() + 8, &seed, 8);
  std::memcpy(out.data() + 16, &size, 8);
  std::memcpy(out.data() + 24, &count, 4);
  uint32_t step32 = static_cast<uint32_t>(step);
  std::memcpy(out.data() + 28, &step32, 4);
  std::memcpy(out.data() + 32, versions.data(), versions.size() * 4);
  return out;
}

std::string State::Parse(std::span<const std::byte> blob) {
  if (blob.size() < 32) return fmt::format("state blob of {} bytes is shorter than its 32-byte header", blob.size());
  uint32_t magic, count, step32;
  std::memcpy(&magic, blob.data(), 4);
  if (magic != kStateMagic) return "state blob has no workload magic";
  std::memcpy(&page_size, blob.data() + 4, 4);
  std::memcpy(&seed, blob.data() + 8, 8);
  std::memcpy(&size, blob.data() + 16, 8);
  std::memcpy(&count, blob.data() + 24, 4);
  std::memcpy(&step32, blob.data() + 28, 4);
  step = step32;
  if (blob.size() != 32 + uint64_t{count} * 4) return fmt::format("state blob holds {} bytes, its header says {}", blob.size(), 32 + uint64_t{count} * 4);
  versions.resize(count);
  std::memcpy(versions.data(), blob.data() + 32, uint64_t{count} * 4);
  return {};
}

}  // namespace gpumigrate::workload
