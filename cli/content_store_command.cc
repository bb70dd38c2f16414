#include "cli/content_store_command.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli/print.h"
#include "gpumigrate/content/content_store.h"
#include "gpumigrate/devices/open_device.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

CLI::App* AddContentStoreCommand(CLI::App& app, ContentStoreFlags& f) {
  auto* c = app.add_subcommand(
      "content-store",
      "Build the content store a destination fills offered pages from (receive --content-store): files this host "
      "already holds, indexed by the SHA-256 of each page.");
  c->require_subcommand(1);
  f.index = c->add_subcommand("index", "Index DIR's files (only those new or changed since the last index) and say what it holds");
  f.add = c->add_subcommand("add", "Write a device's weights (its static regions) into DIR as raw files, then index DIR");
  for (CLI::App* s : {f.index, f.add}) {
    s->add_option("dir", f.dir, "The store's directory")->required()->check(CLI::ExistingDirectory);
    s->add_option("--page-size", f.page_size, "Index pages of this size (the source regions' page size)")
        ->capture_default_str();
    s->add_flag("--json", f.json, "Print one JSON object with the store's figures on stdout");
  }
  f.add->add_option("--device", f.device, "The device whose regions to write (sim:..., proc:PID, shm:PATH)")->required();
  f.add->add_option("--name", f.name, "File name prefix: NAME.<region>.raw (default: the device kind)");
  f.add->add_flag("--all-regions", f.all_regions, "Write every region, not only the static ones");
  return c;
}

namespace {

// Progress on stderr when it is a terminal, at most every 5%.
std::function<void(uint64_t, uint64_t)> ProgressLine(const char* what) {
  if (!::isatty(STDERR_FILENO)) return nullptr;
  return [what, last = -1](uint64_t done, uint64_t total) mutable {
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (pct / 5 == last / 5 && pct != 100) return;
    last = pct;
    Print(stderr, "\r{} {}% ({} of {})", what, pct, FormatBytes(static_cast<double>(done)),
          FormatBytes(static_cast<double>(total)));
    if (pct == 100) Print(stderr, "\n");
  };
}

}  // namespace

int RunContentStore(const ContentStoreFlags& f) {
  auto ps = ParseSize(f.page_size);
  if (!ps.ok() || *ps > (1u << 30)) {
    Print(stderr, "gpumigrate content-store: --page-size {}: {}\n", f.page_size,
          ps.ok() ? "more than 1 GiB" : ps.status().message());
    return 2;
  }
  std::vector<std::string> written;
  if (*f.add) {
    auto opened = OpenDevice(f.device, /*source=*/true);
    if (!opened.ok()) {
      Print(stderr, "gpumigrate content-store add: --device {}: {}\n", f.device, opened.status().message());
      return 2;
    }
    const std::string name = f.name.empty() ? f.device.substr(0, f.device.find(':')) : f.name;
    auto w = DumpRegions(*opened->device, f.dir, name, !f.all_regions, ProgressLine("writing"));
    if (!w.ok()) {
      Print(stderr, "gpumigrate content-store add: {}\n", w.status().message());
      return 2;
    }
    written = std::move(*w);
    for (const auto& p : written) Print(stderr, "content-store: wrote {}\n", p);
  }
  ContentStoreOptions o;
  o.page_size = static_cast<uint32_t>(*ps);
  o.on_progress = ProgressLine("indexing");
  auto store = ContentStore::Open(f.dir, o);
  if (!store.ok()) {
    Print(stderr, "gpumigrate content-store: {}\n", store.status().message());
    return 2;
  }
  const ContentStoreStats& s = (*store)->stats();
  if (!s.rebuilt.empty()) Print(stderr, "content-store: the stored index was not used and was rebuilt: {}\n", s.rebuilt);
  if (f.json) {
    nlohmann::ordered_json j{{"dir", f.dir},
                             {"page_size", o.page_size},
                             {"files", s.files},
                             {"file_bytes", s.file_bytes},
                             {"pages", s.pages},
                             {"duplicate_pages", s.duplicate_pages},
                             {"files_hashed", s.files_hashed},
                             {"bytes_hashed", s.bytes_hashed},
                             {"zero_pages", s.zero_pages},
                             {"index_bytes_in_memory", s.index_bytes_in_memory},
                             {"index_written", s.index_written},
                             {"index_rebuilt", s.rebuilt},
                             {"written", written}};
    Print(stdout, "{}\n", j.dump());
    return 0;
  }
  Print(stdout, "content store {}: {} files ({}), {} distinct pages of {} indexed", f.dir, s.files,
        FormatBytes(static_cast<double>(s.file_bytes)), s.pages, FormatBytes(o.page_size));
  if (s.files_hashed > 0) Print(stdout, " ({} duplicates; {} zero pages left out)", s.duplicate_pages, s.zero_pages);
  Print(stdout, "\n  index: {} in memory; {} file{} hashed now ({}){}\n",
        FormatBytes(static_cast<double>(s.index_bytes_in_memory)), s.files_hashed, s.files_hashed == 1 ? "" : "s",
        FormatBytes(static_cast<double>(s.bytes_hashed)), s.index_written ? ", index written" : ", index unchanged");
  return 0;
}

}  // namespace gpumigrate::cli
