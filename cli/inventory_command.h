// `gpumigrate inventory --base FILE --from-estimates DIR`: attach the outputs of
// `gpumigrate estimate --json` (DIR/<vm name>.json) to the VMs of an inventory as
// their "estimate", check the result as `plan` would, and print it, so nobody
// copies estimates by hand. Exit 2 names the file or key at fault.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace gpumigrate::cli {

struct InventoryFlags {
  std::string base;
  std::string from_estimates;
  std::string out;
};

CLI::App* AddInventoryCommand(CLI::App& app, InventoryFlags& flags);
int RunInventory(const InventoryFlags& flags);

}  // namespace gpumigrate::cli
