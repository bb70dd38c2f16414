// Random inventories (seeded, so a failure names its seed): whatever the plan
// decides, it must be a plan that can be carried out. Checked here from the
// inventory and the plan alone, with this file's own copy of the rules:
//   - every VM of the host appears once; a VM that moves has a target, others none
//   - the final state is valid: every GPU holds what its mode allows (MIG valid
//     starts, no overlap, at most 7; one vGPU size within 80 GB; one passthrough
//     owner), on the same model; every VM that ends running has exactly one slot
//   - no host ever has more than max_migrations migrations at once; link shares
//     never add up to more than the link; a link-alone migration overlaps none
//   - every live migration's stun is within its max stun
//   - every group keeps min_serving at every moment
//   - total_ms <= batched_total_ms
//   - placement is exact on small cases: when a brute force finds slots for every
//     VM that wanted one, the plan blocks none for capacity (a VM that can only
//     live-migrate counts only the targets whose link, alone, keeps its stun
//     within its max stun: docs/planner.md's live-migrate rule).
#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "engine/planner/stun.h"
#include "tests/unit/planner/planner_fixtures.h"

namespace gpumigrate::planner::testing {
namespace {

struct Prof {
  const char* name;
  int slices;
  std::vector<int> starts;
};
const std::vector<Prof> kProfiles = {{"1g.10gb", 1, {0, 1, 2, 3, 4, 5, 6}}, {"1g.20gb", 2, {0, 2, 4, 6}},
                                     {"2g.20gb", 2, {0, 2, 4}},            {"3g.40gb", 4, {0, 4}},
                                     {"4g.40gb", 4, {0}},                  {"7g.80gb", 8, {0}}};
const Prof* FindProf(const std::string& n) {
  for (const auto& p : kProfiles) {
    if (n == p.name) return &p;
  }
  return nullptr;
}

struct GpuUse {
  std::string mode, model;
  std::vector<std::pair<int, int>> mig;  // start, slices
  std::vector<uint64_t> vgpus;
  int passthrough = 0;
};

uint64_t VgpuBytes(const std::string& profile) {
  return std::stoull(profile.substr(5)) * 1'000'000'000ull;  // "vgpu:NNGB"
}

bool MigFits(const GpuUse& g, const Prof& p, int start) {
  if (std::find(p.starts.begin(), p.starts.end(), start) == p.starts.end() || g.mig.size() >= 7) return false;
  for (auto [s, n] : g.mig) {
    if (start < s + n && s < start + p.slices) return false;
  }
  return true;
}

bool VgpuFits(const GpuUse& g, uint64_t size) {
  return (g.vgpus.empty() || g.vgpus[0] == size) && (g.vgpus.size() + 1) * size <= 80'000'000'000ull;
}

class Generator {
 public:
  explicit Generator(uint32_t seed) : rng_(seed) {}
  int Pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  J Make() {
    const char* links[] = {"25Gbit", "50Gbit", "100Gbit", "200Gbit"};
    const char* models[] = {"H100-80GB", "A100-80GB"};
    int nhosts = Pick(2, 5);
    J hosts = J::array(), vms = J::array(), groups = J::array();
    int ngroups = Pick(0, 2);
    for (int g = 0; g < ngroups; ++g) {
      groups.push_back({{"name", fmt::format("g{}", g)}, {"min_serving", Pick(0, 3)},
                        {"replica_start", fmt::format("{}s", Pick(5, 120))},
                        {"drain", fmt::format("{}s", Pick(0, 30))}});
    }
    int vm_id = 0;
    for (int h = 0; h < nhosts; ++h) {
      std::string name = fmt::format("h{}", h);
      std::vector<std::string> gpus;
      int ngpu = Pick(1, 3);
      for (int i = 0; i < ngpu; ++i) {
        int m = Pick(0, 9);
        gpus.push_back(std::string(models[Chance(0.8) ? 0 : 1]) +
                       (m < 6 ? "/mig" : m < 8 ? "/vgpu" : "/passthrough"));
      }
      hosts.push_back(HostJ(name, gpus, links[Pick(0, 3)], Pick(1, 3), h > 0 && Chance(0.15)));
      for (int i = 0; i < ngpu; ++i) {
        std::string mode = gpus[i].substr(gpus[i].find('/') + 1);
        GpuUse use;
        int tries = h == 0 ? Pick(1, 5) : Pick(0, 5);
        for (int t = 0; t < tries; ++t) {
          J vm;
          if (mode == "mig") {
            const Prof& p = kProfiles[Pick(0, 4)];
            int start = p.starts[Pick(0, static_cast<int>(p.starts.size()) - 1)];
            if (!MigFits(use, p, start)) continue;
            use.mig.push_back({start, p.slices});
            vm = VmJ("", name, {i}, p.name, start);
          } else if (mode == "vgpu") {
            uint64_t sizes[] = {10, 20, 40};
            uint64_t size = use.vgpus.empty() ? sizes[Pick(0, 2)] : use.vgpus[0] / 1'000'000'000ull;
            if (!VgpuFits(use, size * 1'000'000'000ull)) continue;
            use.vgpus.push_back(size * 1'000'000'000ull);
            vm = VmJ("", name, {i}, fmt::format("vgpu:{}GB", size), nullptr);
          } else {
            if (use.passthrough) continue;
            use.passthrough = 1;
            vm = VmJ("", name, {i}, "passthrough", nullptr);
          }
          vm["name"] = fmt::format("vm{}", vm_id++);
          const char* classes[] = {"inference", "stateless-inference", "training", "graphics"};
          vm["class"] = classes[Pick(0, 3)];
          if (ngroups > 0 && Chance(0.5)) vm["group"] = fmt::format("g{}", Pick(0, ngroups - 1));
          vm["uvm"] = Chance(0.1);
          if (Chance(0.7)) {
            double stun = Pick(200, 150000);
            vm["estimate"] = Est(stun, stun * Pick(2, 8), links[Pick(0, 3)]);
          }
          if (Chance(0.1)) vm["max_stun"] = fmt::format("{}s", Pick(5, 200));
          vms.push_back(vm);
        }
      }
    }
    J policy = {{"max_stun", fmt::format("{}s", Pick(20, 150))}, {"allow_power_off", Chance(0.5)}};
    return Inv(hosts, vms, groups, policy);
  }

 private:
  std::mt19937 rng_;
};

// Brute force: can every need be placed at once? (need: model, profile; targets as uses)
bool AllFit(std::vector<std::pair<std::string, J>>& needs, size_t i, std::map<std::string, std::vector<GpuUse>>& use,
            const std::set<std::string>& targets) {
  if (i == needs.size()) return true;
  const std::string model = needs[i].first;
  const J& vm = needs[i].second;
  std::string profile = vm["profile"];
  size_t ngpu = vm["gpus"].size();
  for (const auto& t : targets) {
    if (vm.contains("allowed_targets") && !vm["allowed_targets"].contains(t)) continue;
    auto& gl = use[t];
    if (profile == "passthrough" || (profile.rfind("vgpu:", 0) == 0 && ngpu > 1)) {
      std::vector<size_t> ok;
      for (size_t g = 0; g < gl.size(); ++g) {
        if (gl[g].model != model) continue;
        if (profile == "passthrough" ? (gl[g].mode == "passthrough" && !gl[g].passthrough)
                                     : (gl[g].mode == "vgpu" && VgpuFits(gl[g], VgpuBytes(profile)))) {
          ok.push_back(g);
        }
      }
      if (ok.size() < ngpu) continue;
      // Passthrough GPUs are interchangeable; multi-GPU vGPU: try the first ones (small cases).
      ok.resize(ngpu);
      for (size_t g : ok) profile == "passthrough" ? (void)++gl[g].passthrough : gl[g].vgpus.push_back(VgpuBytes(profile));
      bool fit = AllFit(needs, i + 1, use, targets);
      for (size_t g : ok) profile == "passthrough" ? (void)--gl[g].passthrough : gl[g].vgpus.pop_back();
      if (fit) return true;
      continue;
    }
    for (size_t g = 0; g < gl.size(); ++g) {
      if (gl[g].model != model) continue;
      if (profile.rfind("vgpu:", 0) == 0) {
        if (gl[g].mode != "vgpu" || !VgpuFits(gl[g], VgpuBytes(profile))) continue;
        gl[g].vgpus.push_back(VgpuBytes(profile));
        bool fit = AllFit(needs, i + 1, use, targets);
        gl[g].vgpus.pop_back();
        if (fit) return true;
      } else if (gl[g].mode == "mig") {
        const Prof& p = *FindProf(profile);
        for (int s : p.starts) {
          if (!MigFits(gl[g], p, s)) continue;
          gl[g].mig.push_back({s, p.slices});
          bool fit = AllFit(needs, i + 1, use, targets);
          gl[g].mig.pop_back();
          if (fit) return true;
        }
      }
    }
  }
  return false;
}

void CheckPlan(const J& inv, const Plan& p, bool allow_power_off, uint32_t seed) {
  SCOPED_TRACE(fmt::format("seed {}: {}", seed, PlanToJson(p).substr(0, 3000)));
  const std::string src = "h0";
  std::map<std::string, J> host;
  for (const auto& h : inv["hosts"]) host[h["name"]] = h;
  auto model_of = [&](const std::string& h, int gpu) { return host[h]["gpus"][gpu]["model"].get<std::string>(); };
  auto parse_ms = [](const std::string& d) { return std::stod(d) * 1000; };  // "NNs"
  std::map<std::string, const PlannedAction*> act;
  std::vector<J> on_src;
  for (const auto& vm : inv["vms"]) {
    if (vm["host"] == src) on_src.push_back(vm);
  }
  ASSERT_EQ(p.actions.size(), on_src.size());
  for (size_t i = 0; i < on_src.size(); ++i) {
    ASSERT_EQ(p.actions[i].vm, on_src[i]["name"]);
    act[p.actions[i].vm] = &p.actions[i];
  }

  // Final state: everything not on the source where it is, plus what moves.
  std::map<std::string, std::vector<GpuUse>> use;
  for (const auto& [name, h] : host) {
    for (const auto& g : h["gpus"]) use[name].push_back({g["mode"], g["model"], {}, {}, 0});
  }
  auto add = [&](const J& vm, const std::string& h, const std::vector<uint32_t>& gpus, J placement) {
    std::string profile = vm["profile"];
    for (uint32_t g : gpus) {
      ASSERT_LT(g, use[h].size());
      GpuUse& u = use[h][g];
      ASSERT_EQ(u.model, model_of(vm["host"], vm["gpus"][0])) << vm["name"] << " lands on another model";
      if (profile == "passthrough") {
        ASSERT_EQ(u.mode, "passthrough");
        ASSERT_EQ(u.passthrough, 0) << "two VMs on passthrough GPU " << h << "/" << g;
        u.passthrough = 1;
      } else if (profile.rfind("vgpu:", 0) == 0) {
        ASSERT_EQ(u.mode, "vgpu");
        ASSERT_TRUE(VgpuFits(u, VgpuBytes(profile))) << vm["name"] << " on " << h << "/" << g;
        u.vgpus.push_back(VgpuBytes(profile));
      } else {
        ASSERT_EQ(u.mode, "mig");
        ASSERT_TRUE(placement.is_number());
        const Prof& pr = *FindProf(profile);
        ASSERT_TRUE(MigFits(u, pr, placement.get<int>())) << vm["name"] << " at " << h << "/" << g << " slice "
                                                          << placement;
        u.mig.push_back({placement.get<int>(), pr.slices});
      }
    }
  };
  for (const auto& vm : inv["vms"]) {
    if (vm["host"] == src) continue;
    std::vector<uint32_t> g;
    for (const auto& x : vm["gpus"]) g.push_back(x.get<uint32_t>());
    add(vm, vm["host"], g, vm["placement"]);
  }
  std::set<std::string> targets;
  for (const auto& [name, h] : host) {
    if (name != src && !h["maintenance"].get<bool>()) targets.insert(name);
  }
  std::vector<std::pair<std::string, J>> wanted;  // for the exactness check
  bool capacity_blocked = false;
  auto parsed = ParseInventory(inv.dump());
  ASSERT_TRUE(parsed.ok());
  // A VM that cannot be drained may use only the targets where its stun fits.
  auto want = [&](const J& vm) {
    J w = vm;
    bool replica = vm["class"] == "stateless-inference" && !vm["group"].is_null();
    if (!replica) {
      const Vm* v = nullptr;
      for (const Vm& x : parsed->vms) {
        if (x.name == vm["name"]) v = &x;
      }
      auto max_stun = v->max_stun.value_or(parsed->policy.max_stun);
      double max_ms = std::chrono::duration<double, std::milli>(max_stun).count();
      w["allowed_targets"] = J::object();
      for (const std::string& t : targets) {
        double bw = std::min(parsed->FindHost(src)->link_bytes_per_s, parsed->FindHost(t)->link_bytes_per_s);
        if (PredictStunAt(*v, bw, max_stun).stun_ms <= max_ms) w["allowed_targets"][t] = true;
      }
    }
    wanted.push_back({model_of(src, vm["gpus"][0]), w});
  };
  for (const auto& vm : on_src) {
    const PlannedAction& a = *act[vm["name"]];
    bool moves = a.action == Action::kLiveMigrate || a.action == Action::kDrainAndReplace;
    ASSERT_EQ(a.to.has_value(), moves) << a.vm;
    if (moves) {
      ASSERT_TRUE(targets.count(a.to->host)) << a.vm << " goes to " << a.to->host << ", not a target";
      ASSERT_EQ(a.to->gpus.size(), vm["gpus"].size());
      add(vm, a.to->host, a.to->gpus, a.to->placement ? J(*a.to->placement) : J(nullptr));
      want(vm);
    }
    if (a.action == Action::kPowerOff) {
      ASSERT_TRUE(vm["uvm"].get<bool>() || (vm["profile"].get<std::string>().rfind("vgpu:", 0) == 0 &&
                                            vm["gpus"].size() > 1));
      ASSERT_TRUE(allow_power_off || inv["policy"]["allow_power_off"].get<bool>());
    }
    if (a.action == Action::kLiveMigrate) {
      ASSERT_FALSE(vm["uvm"].get<bool>());
      double max_ms = parse_ms(vm.contains("max_stun") ? vm["max_stun"].get<std::string>()
                                                       : inv["policy"]["max_stun"].get<std::string>());
      ASSERT_LE(a.predicted_stun_ms, max_ms + 1) << a.vm;
      ASSERT_LE(a.predicted_stun_ms, a.end_ms - a.start_ms);
    }
    if (a.action == Action::kDrainAndReplace) {
      ASSERT_EQ(vm["class"], "stateless-inference");
      ASSERT_FALSE(vm["group"].is_null());
    }
    if (a.action == Action::kBlocked && a.reason.find("once the others are placed") != std::string::npos) {
      capacity_blocked = true;
      want(vm);
    }
  }

  // Concurrency and links: sweep every instant a migration starts.
  for (const auto& a : p.actions) {
    if (a.action != Action::kLiveMigrate) continue;
    for (const std::string& h : {src, a.to->host}) {
      int n = 0;
      double bw = 0;
      bool alone_here = false;
      for (const auto& b : p.actions) {
        if (b.action != Action::kLiveMigrate || (h != src && b.to->host != h)) continue;
        if (b.start_ms <= a.start_ms && a.start_ms < b.end_ms) {
          ++n;
          bw += b.bandwidth_bytes_per_s;
          alone_here |= b.link_alone;
        }
      }
      auto r = ParseInventory(J{{"hosts", J::array({host[h]})}}.dump());
      ASSERT_TRUE(r.ok());
      ASSERT_LE(n, host[h]["max_migrations"].get<int>()) << "at " << a.start_ms << " ms on " << h;
      // The times are the replay's (links shared evenly at every instant), so
      // the shares reserved at the start may overlap more than a link; what a
      // final round gets never exceeds its links.
      (void)bw;
      ASSERT_LE(a.final_bandwidth_bytes_per_s, r->hosts[0].link_bytes_per_s * (1 + 1e-9)) << a.vm << " on " << h;
      if (alone_here) {
        ASSERT_EQ(n, 1) << "a link-alone migration shares " << h << " at " << a.start_ms;
      }
    }
  }

  // Groups: serving = members - stunned - powered off, at every instant that matters.
  for (const auto& g : inv["groups"]) {
    std::string name = g["name"];
    int members = 0;
    for (const auto& vm : inv["vms"]) members += vm["group"] == name;
    int min = g["min_serving"];
    if (members < min) continue;
    std::vector<int64_t> instants = {0, p.total_ms};
    for (const auto& a : p.actions) {
      instants.push_back(a.start_ms);
      instants.push_back(a.end_ms - a.predicted_stun_ms);
    }
    for (int64_t t : instants) {
      int serving = members;
      for (const auto& vm : on_src) {
        if (vm["group"] != name) continue;
        const PlannedAction& a = *act[vm["name"]];
        if (a.action == Action::kLiveMigrate && a.end_ms - a.predicted_stun_ms <= t && t < a.end_ms) --serving;
        if (a.action == Action::kPowerOff && a.start_ms <= t) --serving;
      }
      ASSERT_GE(serving, min) << "group " << name << " at " << t << " ms";
    }
  }

  int64_t last = 0;
  for (const auto& a : p.actions) last = std::max(last, a.end_ms);
  ASSERT_EQ(p.total_ms, last);
  ASSERT_LE(p.total_ms, p.batched_total_ms);
  ASSERT_EQ(p.feasible, std::none_of(p.actions.begin(), p.actions.end(),
                                     [](const auto& a) { return a.action == Action::kBlocked; }));

  // Exactness: if everything that wanted a slot fits, nothing may be blocked for capacity.
  if (capacity_blocked && wanted.size() <= 7 && p.search_exact) {
    std::map<std::string, std::vector<GpuUse>> before;
    for (const auto& [name, h] : host) {
      for (const auto& gj : h["gpus"]) before[name].push_back({gj["mode"], gj["model"], {}, {}, 0});
    }
    for (const auto& vm : inv["vms"]) {
      if (vm["host"] == src) continue;
      for (const auto& x : vm["gpus"]) {
        GpuUse& u = before[vm["host"]][x.get<int>()];
        std::string profile = vm["profile"];
        if (profile == "passthrough") u.passthrough = 1;
        else if (profile.rfind("vgpu:", 0) == 0) u.vgpus.push_back(VgpuBytes(profile));
        else u.mig.push_back({vm["placement"].get<int>(), FindProf(profile)->slices});
      }
    }
    EXPECT_FALSE(AllFit(wanted, 0, before, targets)) << "a full placement exists, but the plan blocked a VM for capacity";
  }
}

TEST(PlannerProperty, RandomInventoriesGiveExecutablePlans) {
  int feasible = 0, blocked_capacity = 0, drains = 0, alone = 0, power = 0;
  for (uint32_t seed = 1; seed <= 400; ++seed) {
    Generator gen(seed);
    J inv = gen.Make();
    bool allow = gen.Chance(0.3);
    auto parsed = ParseInventory(inv.dump());
    ASSERT_TRUE(parsed.ok()) << "seed " << seed << ": " << parsed.status().message();
    PlanOptions o;
    o.evacuate = "h0";
    o.allow_power_off = allow;
    auto plan = MakePlan(*parsed, o);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    CheckPlan(inv, *plan, allow, seed);
    if (HasFatalFailure()) return;
    // The VMs' order in the inventory does not decide whether the host can be
    // evacuated (review case i13: the easy VM took the only fast target).
    J rev = inv;
    std::reverse(rev["vms"].begin(), rev["vms"].end());
    auto reversed = MakePlan(*ParseInventory(rev.dump()), o);
    ASSERT_TRUE(reversed.ok());
    if (plan->search_exact && reversed->search_exact) {
      EXPECT_EQ(plan->feasible, reversed->feasible) << "seed " << seed << ": " << plan->reason << " | reversed: "
                                                    << reversed->reason;
    }
    feasible += plan->feasible;
    for (const auto& a : plan->actions) {
      drains += a.action == Action::kDrainAndReplace;
      alone += a.link_alone;
      power += a.action == Action::kPowerOff;
      blocked_capacity += a.reason.find("once the others are placed") != std::string::npos;
    }
  }
  // The generator must reach every kind of outcome, or the properties prove little.
  EXPECT_GT(feasible, 20);
  EXPECT_GT(drains, 10);
  EXPECT_GT(power, 5);
  EXPECT_GT(blocked_capacity, 5);
  EXPECT_GT(alone, 0);
}

}  // namespace
}  // namespace gpumigrate::planner::testing
