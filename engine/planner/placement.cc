#include "engine/planner/placement.h"

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gpumigrate::planner {
namespace {

// Lexicographic preference: smaller is better.
using Score = std::array<int64_t, 14>;

struct Candidate {
  Slot slot;
  Score score;
  std::array<uint64_t, 5> key;  // equivalence class of the state it leaves
};

uint64_t ModelId(const GpuModel* m) { return reinterpret_cast<uintptr_t>(m); }

class Search {
 public:
  Search(Fleet& fleet, const std::vector<SlotNeed>& needs, uint64_t budget)
      : fleet_(fleet), needs_(needs), budget_(budget) {
    order_.resize(needs.size());
    std::iota(order_.begin(), order_.end(), 0);
    std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) { return Hardness(a) > Hardness(b); });
    multi_vgpu_ = std::any_of(needs.begin(), needs.end(),
                              [](const SlotNeed& n) { return n.kind == SlotKind::kVgpu && n.gpus > 1; });
    cur_.resize(needs.size());
    // Hosts that some needs may use and others not (a link too slow for one VM's
    // stun) are not interchangeable: a host's class is the set of needs that
    // may use it, and it is part of every equivalence key.
    const size_t nhosts = fleet.inventory().hosts.size();
    std::map<std::string, uint64_t> classes;
    host_class_.assign(nhosts, 0);
    for (uint32_t h = 0; h < nhosts; ++h) {
      std::string sig(needs.size(), '0');
      for (size_t i = 0; i < needs.size(); ++i) sig[i] = static_cast<char>('0' + (needs[i].TargetOk(h) ? 1 : 0) + (needs[i].Holds(h) ? 2 : 0));
      host_class_[h] = classes.emplace(std::move(sig), classes.size()).first->second;
    }
  }

  PlacementResult Run() {
    Dfs(0, 0);
    PlacementResult r;
    r.slots = best_;
    r.exact = !aborted_;
    r.evaluations = evaluations_;
    for (size_t i = 0; i < best_.size(); ++i) {
      if (best_[i]) fleet_.Apply(needs_[i], *best_[i]);
    }
    return r;
  }

 private:
  // Larger is placed first: the VMs with the fewest ways to fit.
  std::tuple<int, uint64_t, int> Hardness(size_t i) const {
    const SlotNeed& n = needs_[i];
    switch (n.kind) {
      case SlotKind::kPassthrough: return {3, n.gpus, 0};
      case SlotKind::kVgpu: return {n.gpus > 1 ? 2 : 0, n.vgpu_bytes * n.gpus, 0};
      case SlotKind::kMig: return {1, n.mig->slices, -__builtin_popcount(n.mig->valid_starts)};
    }
    return {0, 0, 0};
  }

  Score BaseScore(const SlotNeed& n, uint32_t host) const {
    Score s{};
    s[0] = n.group.empty() ? 0 : fleet_.GroupCount(host, n.group);
    s[7] = n.Holds(host) ? 0 : 1;  // a target that holds the VM's weights: they need not cross the link
    s[8] = -static_cast<int64_t>(fleet_.inventory().hosts[host].link_bytes_per_s / 1e6);
    s[9] = fleet_.Placed(host);
    s[10] = host;
    return s;
  }

  // Keeps `c` if it is the best of its equivalence class so far.
  static void Offer(std::map<std::array<uint64_t, 5>, Candidate>& best, const std::array<uint64_t, 5>& key,
                    const Score& score, const std::function<Slot()>& slot) {
    auto it = best.find(key);
    if (it == best.end()) {
      best.emplace(key, Candidate{slot(), score, key});
    } else if (score < it->second.score) {
      it->second = Candidate{slot(), score, key};
    }
  }

  // The candidate slots for `n`, one per equivalence class (the best-scored
  // one: scores are unique, they end in host, GPU and slice), best first.
  std::vector<Candidate> Candidates(const SlotNeed& n) {
    std::map<std::array<uint64_t, 5>, Candidate> best;
    const auto& hosts = fleet_.inventory().hosts;
    for (uint32_t h : fleet_.targets()) {
      if (!n.TargetOk(h)) continue;
      const uint32_t ngpu = static_cast<uint32_t>(hosts[h].gpus.size());
      evaluations_ += ngpu;
      const uint64_t hc = host_class_[h];
      const Score base = BaseScore(n, h);
      if (n.kind == SlotKind::kMig) {
        for (uint32_t pos = 0; pos < ngpu; ++pos) {
          if (!fleet_.SameKind(n, h, pos)) continue;
          const GpuState& g = fleet_.gpu(h, pos);
          const std::vector<uint32_t>& before = MigCapacity(*n.model, g.mask, g.instances);
          for (uint32_t s = 0; s < n.model->mig_slices; ++s) {
            if (!fleet_.Fits(n, h, pos, s)) continue;
            const auto& after = MigCapacity(*n.model, static_cast<uint8_t>(g.mask | n.mig->Mask(s)), g.instances + 1);
            Score score = base;
            for (size_t p = 0; p < after.size() && p < 6; ++p) score[1 + p] = before[p] - after[p];
            score[11] = pos;
            score[12] = s;
            Offer(best, {ModelId(n.model), g.mask, g.instances, s, hc}, score, [&] { return Slot{h, {pos}, s}; });
          }
        }
      } else if (n.kind == SlotKind::kVgpu) {
        std::vector<std::pair<int64_t, uint32_t>> fits;  // (empty GPU opened, pos)
        for (uint32_t pos = 0; pos < ngpu; ++pos) {
          if (fleet_.Fits(n, h, pos, std::nullopt)) fits.push_back({fleet_.gpu(h, pos).vgpus == 0 ? 1 : 0, pos});
        }
        if (fits.size() < n.gpus) continue;
        std::stable_sort(fits.begin(), fits.end());
        Slot slot{h, {}, std::nullopt};
        Score score = base;
        for (uint32_t k = 0; k < n.gpus; ++k) {
          slot.gpu_pos.push_back(fits[k].second);
          score[1] += fits[k].first;
        }
        std::sort(slot.gpu_pos.begin(), slot.gpu_pos.end());
        // Fuller GPUs first (they have least room left for other sizes).
        const GpuState& g = fleet_.gpu(h, slot.gpu_pos.front());
        score[2] = -static_cast<int64_t>(g.vgpus);
        score[11] = slot.gpu_pos.front();
        Offer(best, {ModelId(n.model), g.vgpu_size, g.vgpus, (multi_vgpu_ || n.gpus > 1) ? h + 1ull : 0, hc}, score,
              [&] { return slot; });
      } else {
        std::vector<uint32_t> free;
        for (uint32_t pos = 0; pos < ngpu; ++pos) {
          if (fleet_.Fits(n, h, pos, std::nullopt)) free.push_back(pos);
        }
        if (free.size() < n.gpus) continue;
        Score score = base;
        score[1] = static_cast<int64_t>(free.size() - n.gpus);  // best fit: keep large blocks for large VMs
        Offer(best, {ModelId(n.model), free.size(), 0, 0, hc}, score,
              [&] { return Slot{h, {free.begin(), free.begin() + n.gpus}, std::nullopt}; });
      }
    }
    std::vector<Candidate> out;
    out.reserve(best.size());
    for (auto& [key, c] : best) out.push_back(std::move(c));
    std::sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) { return a.score < b.score; });
    return out;
  }

  // At most how many of the needs from `depth` on can still be placed: each MIG
  // profile no more often than the fleet's GPUs could take it alone (the others
  // unbounded). Cuts the search when a fleet is short of capacity.
  size_t UpperBound(size_t depth) {
    std::map<std::pair<const GpuModel*, const MigProfile*>, size_t> mig;
    size_t others = 0;
    for (size_t d = depth; d < order_.size(); ++d) {
      const SlotNeed& n = needs_[order_[d]];
      if (n.kind == SlotKind::kMig) {
        ++mig[{n.model, n.mig}];
      } else {
        ++others;
      }
    }
    size_t bound = others;
    const auto& hosts = fleet_.inventory().hosts;
    for (const auto& [key, count] : mig) {
      const auto& [model, prof] = key;
      size_t p = static_cast<size_t>(prof - model->mig_profiles.data());
      size_t cap = 0;
      SlotNeed probe;
      probe.kind = SlotKind::kMig;
      probe.model = model;
      for (uint32_t h : fleet_.targets()) {
        evaluations_ += hosts[h].gpus.size();
        for (uint32_t pos = 0; pos < hosts[h].gpus.size() && cap < count; ++pos) {
          if (!fleet_.SameKind(probe, h, pos)) continue;
          const GpuState& g = fleet_.gpu(h, pos);
          cap += MigCapacity(*model, g.mask, g.instances)[p];
        }
        if (cap >= count) break;
      }
      bound += std::min(cap, count);
    }
    return bound;
  }

  void Dfs(size_t depth, size_t placed) {
    if (done_ || aborted_) return;
    if (best_placed_ >= 0 && evaluations_ > budget_) {
      aborted_ = true;
      return;
    }
    const size_t n = needs_.size();
    if (best_placed_ >= 0 && placed + (n - depth) <= static_cast<size_t>(best_placed_)) return;
    if (best_placed_ >= 0 && depth < n && placed + UpperBound(depth) <= static_cast<size_t>(best_placed_)) return;
    if (depth == n) {
      best_ = cur_;
      best_placed_ = static_cast<int64_t>(placed);
      done_ = placed == n;
      return;
    }
    const size_t i = order_[depth];
    for (const Candidate& c : Candidates(needs_[i])) {
      fleet_.Apply(needs_[i], c.slot);
      cur_[i] = c.slot;
      Dfs(depth + 1, placed + 1);
      fleet_.Undo(needs_[i], c.slot);
      cur_[i].reset();
      if (done_ || aborted_) return;
    }
    Dfs(depth + 1, placed);
  }

  Fleet& fleet_;
  const std::vector<SlotNeed>& needs_;
  uint64_t budget_;
  std::vector<size_t> order_;
  std::vector<uint64_t> host_class_;
  bool multi_vgpu_ = false;
  std::vector<std::optional<Slot>> cur_, best_;
  int64_t best_placed_ = -1;
  bool done_ = false, aborted_ = false;
  uint64_t evaluations_ = 0;
};

}  // namespace

PlacementResult Place(Fleet& fleet, const std::vector<SlotNeed>& needs, uint64_t budget) {
  if (needs.empty()) return {};
  return Search(fleet, needs, budget).Run();
}

namespace {

// "b gpu 0, b gpu 1, c gpu 0 and 3 more"
std::string ListSome(const std::vector<std::string>& items, size_t most = 4) {
  if (items.size() <= most) return fmt::format("{}", fmt::join(items, ", "));
  return fmt::format("{} and {} more", fmt::join(items.begin(), items.begin() + static_cast<long>(most), ", "),
                     items.size() - most);
}

std::string Slices(uint8_t mask) {
  std::vector<uint32_t> s;
  for (uint32_t i = 0; i < 8; ++i) {
    if (mask & (1u << i)) s.push_back(i);
  }
  return fmt::format("{}", fmt::join(s, " "));
}

// "; h2 has H100 GPUs but is in maintenance, so not a target": hosts left out as
// targets although they have the model, or "".
std::string MaintenanceNote(const std::vector<Host>& hosts, const SlotNeed& need) {
  std::vector<std::string> maintenance;
  for (const Host& h : hosts) {
    if (!h.maintenance) continue;
    bool has = std::any_of(h.gpus.begin(), h.gpus.end(), [&](const Gpu& g) { return g.model == need.model->name; });
    if (has) maintenance.push_back(h.name);
  }
  if (maintenance.empty()) return "";
  return fmt::format("; {} {} {} GPUs but {} in maintenance, so not a target", fmt::join(maintenance, ", "),
                     maintenance.size() == 1 ? "has" : "have", need.model->name,
                     maintenance.size() == 1 ? "is" : "are");
}

}  // namespace

std::string ShortfallText(const Fleet& fleet, const SlotNeed& need) {
  const auto& hosts = fleet.inventory().hosts;
  uint32_t same_model = 0;
  std::vector<std::string> names, taken, full7, vgpu_size, vgpu_full;
  const bool mig = need.kind == SlotKind::kMig;
  uint32_t too_slow = 0;
  for (uint32_t h : fleet.targets()) {
    if (!need.TargetOk(h)) {
      ++too_slow;
      continue;
    }
    names.push_back(hosts[h].name);
    for (uint32_t pos = 0; pos < hosts[h].gpus.size(); ++pos) {
      if (!fleet.SameKind(need, h, pos)) continue;
      ++same_model;
      const GpuState& g = fleet.gpu(h, pos);
      std::string gpu = fmt::format("{} gpu {}", hosts[h].name, fleet.gpu_info(h, pos).index);
      if (mig) {
        if (g.instances >= need.model->mig_max_instances) {
          full7.push_back(gpu);
        } else {
          taken.push_back(fmt::format("{} (slices {} in use)", gpu, Slices(g.mask)));
        }
      } else if (need.kind == SlotKind::kVgpu && g.vgpus > 0) {
        if (g.vgpu_size != need.vgpu_bytes) {
          vgpu_size.push_back(fmt::format("{} holds {} vGPUs", gpu, DecimalGB(g.vgpu_size)));
        } else {
          vgpu_full.push_back(fmt::format("{} ({} x {})", gpu, g.vgpus, DecimalGB(g.vgpu_size)));
        }
      }
    }
  }
  const std::string skipped = MaintenanceNote(hosts, need);
  if (names.empty() && too_slow > 0) return "no target with a link fast enough for its stun";
  if (names.empty()) {
    return fmt::format("no slot for it: there is no target host{}{}",
                       skipped.empty() ? " (the inventory has no other host)" : "", skipped);
  }
  const std::string where = fmt::format("on the targets{} ({})", too_slow ? " where its stun fits" : "",
                                        fmt::join(names, ", "));
  std::string mode = mig ? "mig" : need.kind == SlotKind::kVgpu ? "vgpu" : "passthrough";
  if (same_model == 0) {
    return fmt::format("no {} GPU in {} mode {}: a VM's device state only loads on the same model{}",
                       need.model->name, mode, where, skipped);
  }
  std::string detail;
  if (mig) {
    std::vector<uint32_t> starts;
    for (uint32_t st = 0; st < 8; ++st) {
      if (need.mig->ValidStart(st)) starts.push_back(st);
    }
    std::vector<std::string> parts;
    if (!taken.empty()) {
      parts.push_back(fmt::format("{} starts only at slice{} {}; taken on {}", need.mig->name,
                                  starts.size() == 1 ? "" : "s", fmt::join(starts, " "), ListSome(taken)));
    }
    if (!full7.empty()) {
      parts.push_back(fmt::format("at the {}-instance limit: {}", need.model->mig_max_instances, ListSome(full7)));
    }
    detail = fmt::format(": {}", fmt::join(parts, "; "));
  } else if (need.kind == SlotKind::kVgpu) {
    std::vector<std::string> parts;
    if (!vgpu_size.empty()) {
      parts.push_back(fmt::format("every vGPU on one GPU has the same size, and {}", ListSome(vgpu_size)));
    }
    if (!vgpu_full.empty()) {
      parts.push_back(fmt::format("no room left within {} on {}", DecimalGB(need.model->memory_bytes),
                                  ListSome(vgpu_full)));
    }
    if (!parts.empty()) detail = fmt::format(": {}", fmt::join(parts, "; "));
  }
  return fmt::format("no {} {} once the others are placed{}{}", need.Describe(), where, detail, skipped);
}

}  // namespace gpumigrate::planner
