// The models a content store holds, by name: what an agent's inventory says
// its host holds ("models"), so the planner prefers it for a VM serving one.
#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>

#include <fmt/format.h>

#include "gpumigrate/content/content_store.h"

namespace gpumigrate {

Result<std::vector<std::string>> ContentStoreModels(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return Status::FromErrno(ec.value(), fmt::format("content store {}: cannot list it", dir));
  std::set<std::string> names;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.front() == '.') continue;  // the index, and anything hidden
    std::error_code kind;
    if (it->is_directory(kind)) {
      names.insert(name);
    } else if (it->is_regular_file(kind)) {
      names.insert(name.substr(0, name.find('.')));
    }
  }
  if (ec) return Status::FromErrno(ec.value(), fmt::format("content store {}: listing it failed", dir));
  return std::vector<std::string>(names.begin(), names.end());
}

}  // namespace gpumigrate
