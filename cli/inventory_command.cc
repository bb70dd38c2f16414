#include "cli/inventory_command.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/plan_command.h"
#include "cli/print.h"
#include "gpumigrate/planner/planner.h"

namespace gpumigrate::cli {

CLI::App* AddInventoryCommand(CLI::App& app, InventoryFlags& f) {
  auto* c = app.add_subcommand(
      "inventory",
      "Assemble a planner inventory: attach each VM's `gpumigrate estimate --json` output (DIR/<vm>.json) to the "
      "inventory's VMs as their estimate, check it, print it.");
  c->add_option("--base", f.base, "Inventory JSON with hosts, groups and VMs (estimates optional)")->required();
  c->add_option("--from-estimates", f.from_estimates,
                "Directory of `gpumigrate estimate --json` outputs, one per VM, named <vm name>.json")
      ->required();
  c->add_option("--out", f.out, "Write the inventory here instead of stdout");
  return c;
}

int RunInventory(const InventoryFlags& f) {
  namespace fs = std::filesystem;
  std::string text, error;
  if (!ReadWholeFile(f.base, &text, &error)) {
    Print(stderr, "gpumigrate inventory: --base {}\n", error);
    return 2;
  }
  // Check the base first, so its errors name its own keys.
  if (auto base = planner::ParseInventory(text); !base.ok()) {
    Print(stderr, "gpumigrate inventory: {}: {}\n", f.base, base.status().message());
    return 2;
  }
  nlohmann::ordered_json inv = nlohmann::ordered_json::parse(text);
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(f.from_estimates, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  }
  if (ec) {
    Print(stderr, "gpumigrate inventory: --from-estimates {}: {}\n", f.from_estimates, ec.message());
    return 2;
  }
  std::sort(files.begin(), files.end());
  auto& vms = inv["vms"];
  std::vector<std::string> attached;
  for (const auto& path : files) {
    std::string vm = path.stem().string();
    auto it = std::find_if(vms.begin(), vms.end(), [&](const auto& v) { return v.value("name", "") == vm; });
    if (it == vms.end()) {
      Print(stderr, "gpumigrate inventory: {}: no VM '{}' in {} (estimate files are named <vm name>.json)\n",
                 path.string(), vm, f.base);
      return 2;
    }
    std::string est;
    if (!ReadWholeFile(path.string(), &est, &error)) {
      Print(stderr, "gpumigrate inventory: {}\n", error);
      return 2;
    }
    auto j = nlohmann::ordered_json::parse(est, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      Print(stderr, "gpumigrate inventory: {}: not the JSON object of `gpumigrate estimate --json`\n",
                 path.string());
      return 2;
    }
    (*it)["estimate"] = std::move(j);
    attached.push_back(vm);
  }
  std::string merged = inv.dump(2);
  auto checked = planner::ParseInventory(merged);
  if (!checked.ok()) {
    Print(stderr, "gpumigrate inventory: with the estimates of {}: {}\n", f.from_estimates,
               checked.status().message());
    return 2;
  }
  std::vector<std::string> without;
  for (const auto& vm : checked->vms) {
    if (!vm.estimate.present) without.push_back(vm.name);
  }
  Print(stderr, "attached {} estimate(s); {} VM(s) without one{}{}\n", attached.size(), without.size(),
             without.empty() ? "" : " (planned from their frame-buffer size alone): ",
             fmt::format("{}", fmt::join(without, ", ")));
  if (f.out.empty()) {
    Print("{}\n", merged);
  } else {
    std::ofstream out(f.out, std::ios::binary | std::ios::trunc);
    out << merged << "\n";
    if (!out) {
      Print(stderr, "gpumigrate inventory: --out {}: cannot be written\n", f.out);
      return 2;
    }
  }
  return 0;
}

}  // namespace gpumigrate::cli
