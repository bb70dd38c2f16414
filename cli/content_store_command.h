// `gpumigrate content-store`: build and inspect the content store a destination
// fills offered pages from (receive --content-store).
//   content-store index DIR [--page-size 4KiB] [--json]
//       index (or bring up to date) the files of DIR; print what it holds
//   content-store add DIR --device SPEC [--name NAME] [--all-regions] [--page-size 4KiB] [--json]
//       write a device's static regions (its weights; all with --all-regions)
//       into DIR as raw files, then index DIR
// Exit 2: a usage error, a directory or device that cannot be used.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace gpumigrate::cli {

struct ContentStoreFlags {
  std::string dir;
  std::string page_size = "4KiB";
  std::string device;
  std::string name;
  bool all_regions = false;
  bool json = false;
  CLI::App* index = nullptr;
  CLI::App* add = nullptr;
};

CLI::App* AddContentStoreCommand(CLI::App& app, ContentStoreFlags& flags);
int RunContentStore(const ContentStoreFlags& flags);

}  // namespace gpumigrate::cli
