// Evacuation planner: given an inventory of hosts, GPUs, replica groups and VMs
// (with their stun estimates), decide for every VM of the host to evacuate what
// happens to it (live-migrate, drain-and-replace, power-off, blocked), where it
// goes (MIG start slices, time-sliced vGPU, whole passthrough GPUs), and when
// (an event-driven schedule that shares links and keeps replica groups serving).
// The formats and rules are docs/planner.md; this header is their model.
//
//   ParseInventory   JSON text -> Inventory; every malformed or inconsistent
//                    input is an InvalidArgument naming the key path
//                    ("vms[3].placement: slot 5 is not a valid start for 3g.40gb").
//   MakePlan         Inventory + host -> Plan (pure: no I/O, no clock).
//   PlanToJson       the plan format of docs/planner.md, byte-for-byte deterministic.
//
// Pure logic throughout: the CLI reads files and prints. Not thread-safe per
// object; separate calls on separate objects may run concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::planner {

enum class GpuMode { kMig, kVgpu, kPassthrough };
enum class VmClass { kInference, kStatelessInference, kTraining, kGraphics };
enum class SlotKind { kMig, kVgpu, kPassthrough };

struct Gpu {
  uint32_t index = 0;
  std::string model;  // a known model: "H100-80GB", "A100-80GB"
  GpuMode mode = GpuMode::kMig;
};

struct Host {
  std::string name;
  std::string link_text;  // as written, e.g. "100Gbit"
  double link_bytes_per_s = 0;
  uint32_t max_migrations = 2;
  bool maintenance = false;
  std::string agent;
  std::vector<Gpu> gpus;
  // "models": the weights its content store holds (receive --content-store),
  // by name: a VM whose "model" is one of them moves there without sending them.
  std::set<std::string> models;
  bool Holds(const std::string& model) const { return !model.empty() && models.count(model) > 0; }
};

struct Group {
  std::string name;
  uint32_t min_serving = 0;
  std::chrono::nanoseconds replica_start{0};
  // How long the old replica drains once its replacement is ready (key "drain";
  // default policy.drain). An extension of docs/planner.md, added as a key.
  std::chrono::nanoseconds drain{0};
};

// What the inventory says about a VM's stun. `profile` is present when the
// estimate carries the measured profile (the whole `gpumigrate estimate --json`),
// so the engine's own model can be re-run at the bandwidth the schedule gives.
struct VmEstimate {
  bool present = false;
  std::string link_text;
  double link_bytes_per_s = 0;
  double stun_ms = 0, total_ms = 0;
  std::optional<DeviceProfile> profile;
  ModelParams params;               // fixed cost, downtime target, max rounds of the estimate
  double pipeline_bytes_per_s = 0;  // the source's own pipeline cap (0: unknown, the link only)
};

struct Vm {
  std::string name;
  std::string host;
  std::vector<uint32_t> gpus;  // GPU indices on `host`
  std::string profile;         // as written: "3g.40gb", "vgpu:20GB", "passthrough"
  SlotKind kind = SlotKind::kMig;
  uint64_t bytes_per_gpu = 0;  // frame buffer per GPU: the vGPU size, the MIG profile's, the whole GPU's
  std::optional<uint32_t> placement;       // kMig: the start slice
  VmClass vm_class = VmClass::kInference;
  std::string group;  // empty: none
  bool uvm = false;   // as written, or implied (multi-GPU vGPU)
  bool uvm_implied = false;
  VmEstimate estimate;
  std::optional<std::chrono::nanoseconds> max_stun;  // overrides the policy
  std::string model;  // "model": the weights it serves (matched with hosts' "models"); empty: none said
};

struct Policy {
  std::chrono::nanoseconds max_stun = kDefaultMaxStun;
  bool allow_power_off = false;
  std::chrono::nanoseconds drain = std::chrono::seconds(30);  // groups without their own "drain"
  // Each live migration's time budget under `evacuate` (its --max-total): the
  // larger of budget_factor x its planned duration and budget_min. A migration
  // that can no longer end within it aborts (the source runs on) and is re-planned.
  double budget_factor = 3.0;
  std::chrono::nanoseconds budget_min = std::chrono::seconds(60);
  // What each live migration costs beyond its transfer, as `evacuate` runs it:
  // the agents start a receive and a migrate process (TLS handshakes, the
  // device opened), the receive ends after the source, the controller polls.
  // A third is planned before the transfer, the rest after it (the target's
  // receive finishing). Measured 1.4-1.6 s per migration on the project's
  // 2-core VM (README, perf/run evacuate).
  std::chrono::nanoseconds migration_overhead = std::chrono::milliseconds(1500);
  // How long `evacuate` takes to start one live migration (a receive request to
  // the target's agent, then a migrate request to the source's): migrations
  // that may start together start this far apart, so they do not all switch
  // over at once. Measured about 100 ms on the project's 2-core VM.
  std::chrono::nanoseconds start_interval = std::chrono::milliseconds(100);
  // What of a link's rate carries migration payload: TCP/IP and TLS headers take
  // the rest (a 1500-byte frame carries 1448 bytes of TCP payload). Plans divide
  // link × this among the migrations on it, and `evacuate` paces each at its
  // part, so a link so shared never builds a queue. (0, 1].
  double link_efficiency = 0.95;
};

struct Inventory {
  Policy policy;
  std::vector<Host> hosts;
  std::vector<Group> groups;
  std::vector<Vm> vms;

  const Host* FindHost(std::string_view name) const;
  const Group* FindGroup(std::string_view name) const;
};

// Parses and validates an inventory (docs/planner.md, version 1). Unknown keys are
// ignored (the format is extended by adding keys).
Result<Inventory> ParseInventory(std::string_view json_text);

// Frame-buffer bytes of a VM (what a stop-and-copy moves; what an estimate-less
// VM is estimated from).
uint64_t FrameBufferBytes(const Vm& vm);

struct PlanOptions {
  std::string evacuate;
  bool allow_power_off = false;  // --allow-power-off; either this or the policy allows it
  // Candidate evaluations the exact placement search may spend before it keeps the
  // best assignment found so far (then Plan::search_exact is false).
  uint64_t search_budget = 10'000'000;
};

enum class Action { kLiveMigrate, kDrainAndReplace, kPowerOff, kBlocked };
std::string_view ActionName(Action a);  // "live-migrate", "drain-and-replace", "power-off", "blocked"

struct Target {
  std::string host;
  std::vector<uint32_t> gpus;
  std::optional<uint32_t> placement;  // the MIG start slice; none off MIG
};

struct PlannedAction {
  std::string vm;
  Action action = Action::kBlocked;
  std::optional<Target> to;
  int64_t predicted_stun_ms = 0;
  int64_t start_ms = 0, end_ms = 0;
  int64_t budget_ms = 0;  // live-migrate: the migration's time budget (Policy::budget_*); 0: none
  std::string reason;
  // Extensions (added keys): how the stun was predicted and at what bandwidth.
  double bandwidth_bytes_per_s = 0;  // live-migrate: the share it gets
  uint32_t link_shared_with = 0;     // other migrations it may share a link with
  // live-migrate: the share of its final round (the stun), from the migrations
  // the schedule runs beside it then (alone: the whole link).
  double final_bandwidth_bytes_per_s = 0;
  uint32_t final_shared_with = 0;
  bool link_alone = false;           // needs the link alone to stay within max stun
  std::string stun_basis;            // "profile", "scaled", "frame-buffer"
};

struct Plan {
  std::string host;
  bool feasible = false;
  std::string reason;
  int64_t total_ms = 0;
  int64_t batched_total_ms = 0;
  std::vector<PlannedAction> actions;  // every VM of `host`, in inventory order
  bool search_exact = true;            // the placement search finished within its budget
  uint64_t search_evaluations = 0;
  bool used_batched = false;           // the pipelined order was no shorter: batched timing
};

// Errors: InvalidArgument when `options.evacuate` names no host (CLI exit 2). An
// evacuation that cannot be done is a Plan with feasible == false, not an error.
Result<Plan> MakePlan(const Inventory& inventory, const PlanOptions& options);

std::string PlanToJson(const Plan& plan);
// A plan PlanToJson wrote (`gpumigrate plan --json`), back into a Plan; the
// error names the key, and a plan of another host than `host` is refused.
Result<Plan> PlanFromJson(std::string_view text, const std::string& host);

// What one GPU of a host holds and could still take, from the inventory's VMs
// (an agent's /metrics: its free MIG slices and vGPU room).
struct GpuOccupancy {
  uint32_t index = 0;
  GpuMode mode = GpuMode::kMig;
  uint32_t vms = 0;               // VMs with a slot on it
  uint32_t mig_slices = 0;        // kMig: the model's slices
  uint32_t mig_slices_used = 0;   // kMig
  uint64_t memory_bytes = 0;      // the model's frame buffer
  uint64_t vgpu_bytes_used = 0;   // kVgpu: vGPUs on it times their size
  bool passthrough_used = false;  // kPassthrough
};
// Every GPU of `host`, in the inventory's order; empty when there is no such host.
std::vector<GpuOccupancy> HostOccupancy(const Inventory& inventory, std::string_view host);

}  // namespace gpumigrate::planner
