// Test helpers: compare two devices byte for byte, and check the sim's
// activation canaries against a stop position (the QEMU migration-test idea).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "engine/devices/sim/content.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/devices/sim.h"

namespace gpumigrate::testing {

inline ::testing::AssertionResult DevicesEqual(Device& a, Device& b) {
  if (a.Regions().size() != b.Regions().size()) return ::testing::AssertionFailure() << "region counts differ";
  std::vector<std::byte> ba, bb;
  uint64_t differing = 0;
  std::string first;
  for (const RegionInfo& r : a.Regions()) {
    const uint64_t chunk = uint64_t{4} << 20;
    for (uint64_t off = 0; off < r.size_bytes; off += chunk) {
      uint64_t len = std::min(chunk, r.size_bytes - off);
      ba.resize(len);
      bb.resize(len);
      if (Status s = a.Read(r.id, off, ba); !s.ok()) return ::testing::AssertionFailure() << s.ToString();
      if (Status s = b.Read(r.id, off, bb); !s.ok()) return ::testing::AssertionFailure() << s.ToString();
      if (std::memcmp(ba.data(), bb.data(), len) == 0) continue;
      for (uint64_t o = 0; o < len; o += r.page_size) {
        uint64_t n = std::min<uint64_t>(r.page_size, len - o);
        if (std::memcmp(ba.data() + o, bb.data() + o, n) != 0) {
          if (differing++ == 0) first = fmt::format("region {} page {}", r.name, (off + o) / r.page_size);
        }
      }
    }
  }
  if (differing) return ::testing::AssertionFailure() << differing << " pages differ, first: " << first;
  return ::testing::AssertionSuccess();
}

// Checks every activation page of `dev` holds the canary of the step that must
// have written it last, given the workload stopped at `pos`: pages of kernels
// already run in step pos.step carry pos.step, the rest pos.step - 1 (or 1, the
// load, before the first step). Returns how many pages were wrong.
inline ::testing::AssertionResult ActivationsConsistent(Device& dev, const SimSpec& spec, const SimPosition& pos) {
  const RegionInfo* act = FindRegion(dev.Regions(), 2);
  if (act == nullptr) return ::testing::AssertionFailure() << "no activations region";
  const uint64_t n = act->pages();
  const uint64_t boundary = pos.layer * n / spec.layers;
  std::vector<std::byte> page(act->page_size), expect(act->page_size);
  uint64_t wrong = 0;
  std::string first;
  for (uint64_t p = 0; p < n; ++p) {
    uint64_t want = p < boundary ? pos.step : pos.step - 1;
    if (want < 2) want = 1;
    if (Status s = dev.Read(act->id, p * act->page_size, page); !s.ok()) {
      return ::testing::AssertionFailure() << s.ToString();
    }
    sim::Canary c = sim::ReadCanary(page, act->id, p);
    sim::FillPage(spec.seed, act->id, p, static_cast<uint32_t>(want), sim::ContentKind::kActivations, expect);
    if (c.version != want || !c.matches_identity || page != expect) {
      if (wrong++ == 0) first = fmt::format("page {} holds step {} (identity {}), expected step {}", p, c.version,
                                            c.matches_identity ? "ok" : "wrong", want);
    }
  }
  if (wrong) {
    return ::testing::AssertionFailure() << wrong << " of " << n << " activation pages inconsistent with stop at step "
                                         << pos.step << " layer " << pos.layer << "; first: " << first;
  }
  return ::testing::AssertionSuccess();
}

// The QEMU check without knowing the stop point: canaries must read s..s then
// s-1..s-1 from the first page to the last, with at most one step down.
inline ::testing::AssertionResult ActivationsMonotone(Device& dev) {
  const RegionInfo* act = FindRegion(dev.Regions(), 2);
  std::vector<std::byte> page(act->page_size);
  uint64_t first_version = 0, prev = 0;
  int steps_down = 0;
  for (uint64_t p = 0; p < act->pages(); ++p) {
    if (Status s = dev.Read(act->id, p * act->page_size, page); !s.ok()) {
      return ::testing::AssertionFailure() << s.ToString();
    }
    sim::Canary c = sim::ReadCanary(page, act->id, p);
    if (!c.matches_identity) return ::testing::AssertionFailure() << "page " << p << " has no canary of its own";
    if (p == 0) first_version = prev = c.version;
    if (c.version != prev) {
      if (c.version + 1 != prev || c.version + 1 != first_version || ++steps_down > 1) {
        return ::testing::AssertionFailure() << "page " << p << " holds step " << c.version << " after a page with step "
                                             << prev << " (a lost or stale page)";
      }
    }
    prev = c.version;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace gpumigrate::testing
