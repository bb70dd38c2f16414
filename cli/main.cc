// gpumigrate: the command-line front end. Parses flags, prints progress and
// reports; the work happens in libgpumigrate.
//
// Exit codes (docs/design.md, CLI contract): 0 success; 1 failed and rolled back
// (source running, nothing lost); 2 usage or configuration error; 3 outcome in
// doubt (both sides stopped, source state intact).
#include <csignal>

#include <atomic>
#include <iostream>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/agent_command.h"
#include "cli/checkpoint_commands.h"
#include "cli/content_store_command.h"
#include "cli/cuda_commands.h"
#include "cli/demo_command.h"
#include "cli/calibrate_command.h"
#include "cli/estimate_command.h"
#include "cli/evacuate_command.h"
#include "cli/inventory_command.h"
#include "cli/net_commands.h"
#include "cli/plan_command.h"
#include "cli/print.h"
#include "cli/proc_commands.h"
#include "cli/status_command.h"

using gpumigrate::cli::Print;

namespace {

std::atomic<bool> g_cancel{false};

void OnSignal(int) {
  // First Ctrl-C aborts the migration cleanly (source keeps running); a second kills.
  if (g_cancel.exchange(true)) std::_Exit(130);
}

// "demo, estimate, migrate, ..." in the order they were added.
std::string CommandNames(CLI::App& app) {
  std::string names;
  for (CLI::App* sc : app.get_subcommands(std::function<bool(CLI::App*)>())) {
    names += (names.empty() ? "" : ", ") + sc->get_name();
  }
  return names;
}

// A first word that is no command: name it and list the real ones (CLI11 would
// only say that a subcommand is required).
bool IsUnknownCommand(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  for (CLI::App* sc : app.get_subcommands(std::function<bool(CLI::App*)>())) {
    if (sc->check_name(argv[1])) return false;
  }
  return true;
}

// `gpumigrate help [COMMAND]`.
int PrintHelp(CLI::App& app, const std::string& topic) {
  if (topic.empty()) {
    std::cout << app.help();
    return 0;
  }
  try {
    std::cout << app.get_subcommand(topic)->help();
    return 0;
  } catch (const CLI::OptionNotFound&) {
    Print(stderr, "gpumigrate help: no command '{}'; the commands are: {}\n", topic, CommandNames(app));
    return 2;
  }
}

// Every command's flags and its subcommand, registered in the order `--help` lists them.
struct CliCommandSet {
  gpumigrate::cli::DemoFlags demo;
  CLI::App* demo_cmd = nullptr;
  gpumigrate::cli::EstimateFlags estimate;
  CLI::App* estimate_cmd = nullptr;
  gpumigrate::cli::MigrateFlags migrate;
  CLI::App* migrate_cmd = nullptr;
  gpumigrate::cli::ReceiveFlags receive;
  CLI::App* receive_cmd = nullptr;
  gpumigrate::cli::HeldFlags held;  // resume and release share theirs
  CLI::App* resume_cmd = nullptr;
  CLI::App* release_cmd = nullptr;
  gpumigrate::cli::CheckpointFlags checkpoint;
  CLI::App* checkpoint_cmd = nullptr;
  gpumigrate::cli::RestoreFlags restore;
  CLI::App* restore_cmd = nullptr;
  gpumigrate::cli::PlanFlags plan;
  CLI::App* plan_cmd = nullptr;
  gpumigrate::cli::InventoryFlags inventory;
  CLI::App* inventory_cmd = nullptr;
  gpumigrate::cli::CudaFlags cuda;
  CLI::App* cuda_cmd = nullptr;
  gpumigrate::cli::CalibrateFlags calibrate;
  CLI::App* calibrate_cmd = nullptr;
  gpumigrate::cli::AgentFlags agent;
  CLI::App* agent_cmd = nullptr;
  gpumigrate::cli::AgentCallFlags agent_call;
  CLI::App* agent_call_cmd = nullptr;
  gpumigrate::cli::EvacuateFlags evacuate;
  CLI::App* evacuate_cmd = nullptr;
  gpumigrate::cli::StatusFlags status;
  CLI::App* status_cmd = nullptr;
  gpumigrate::cli::ContentStoreFlags content_store;
  CLI::App* content_store_cmd = nullptr;
  std::string help_topic;
  CLI::App* help_cmd = nullptr;
};

// The version flag and the footer every `--help` ends with.
void SetTopLevelOptions(CLI::App& app) {
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("gpumigrate ") + GPUMIGRATE_VERSION);
  app.footer(
      "Exit codes: 0 success; 1 failed and rolled back (source running, nothing lost);\n"
      "2 usage or configuration error; 3 outcome in doubt (both sides stopped, source intact).\n"
      "Sizes: 256MiB, 80GB. Rates: 100Gbit, 2GiB/s, 500MB/s. Durations: 300ms, 100s.");
}

// Registers every command; the flags bind to c's members, so c must outlive the parse.
void AddAllCommands(CLI::App& app, CliCommandSet& c) {
  c.demo_cmd = gpumigrate::cli::AddDemoCommand(app, c.demo);
  c.estimate_cmd = gpumigrate::cli::AddEstimateCommand(app, c.estimate);
  c.migrate_cmd = gpumigrate::cli::AddMigrateCommand(app, c.migrate);
  c.receive_cmd = gpumigrate::cli::AddReceiveCommand(app, c.receive);
  c.resume_cmd = gpumigrate::cli::AddResumeCommand(app, c.held);
  c.release_cmd = gpumigrate::cli::AddReleaseCommand(app, c.held);
  c.checkpoint_cmd = gpumigrate::cli::AddCheckpointCommand(app, c.checkpoint);
  c.restore_cmd = gpumigrate::cli::AddRestoreCommand(app, c.restore);
  c.plan_cmd = gpumigrate::cli::AddPlanCommand(app, c.plan);
  c.inventory_cmd = gpumigrate::cli::AddInventoryCommand(app, c.inventory);
  c.cuda_cmd = gpumigrate::cli::AddCudaCommand(app, c.cuda);
  c.calibrate_cmd = gpumigrate::cli::AddCalibrateCommand(app, c.calibrate);
  c.agent_cmd = gpumigrate::cli::AddAgentCommand(app, c.agent);
  c.agent_call_cmd = gpumigrate::cli::AddAgentCallCommand(app, c.agent_call);
  c.evacuate_cmd = gpumigrate::cli::AddEvacuateCommand(app, c.evacuate);
  c.status_cmd = gpumigrate::cli::AddStatusCommand(app, c.status);
  c.content_store_cmd = gpumigrate::cli::AddContentStoreCommand(app, c.content_store);
  c.help_cmd = app.add_subcommand("help", "Describe a command and every option it takes");
  c.help_cmd->add_option("command", c.help_topic, "The command to describe");
}

// The exit code when the command line ends the run here (an unknown command, a
// parse error, --help or --version); nullopt when a command is to run.
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv) {
  if (IsUnknownCommand(app, argc, argv)) {
    Print(stderr, "gpumigrate: unknown command '{}'; the commands are: {} (gpumigrate --help describes them)\n",
               argv[1], CommandNames(app));
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return std::nullopt;
}

// SIGINT and SIGTERM cancel the command cleanly (OnSignal); SIGPIPE is ignored.
void InstallSignalHandlers() {
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  // A reader of our stdout or stderr that goes away (`| head`, a log shipper
  // that dies) must not kill a migration mid-way: a guest held for switchover
  // would stay paused. Writes to it fail with EPIPE instead and are dropped;
  // sockets already send with MSG_NOSIGNAL for library users (issue 19).
  std::signal(SIGPIPE, SIG_IGN);
}

// Runs the one command the parse chose.
int RunChosenCommand(CliCommandSet& c) {
  if (*c.demo_cmd) return gpumigrate::cli::RunDemo(c.demo, g_cancel);
  if (*c.estimate_cmd) return gpumigrate::cli::RunEstimate(c.estimate);
  if (*c.calibrate_cmd) return gpumigrate::cli::RunCalibrate(c.calibrate);
  if (*c.migrate_cmd) return gpumigrate::cli::RunMigrate(c.migrate, g_cancel);
  if (*c.receive_cmd) return gpumigrate::cli::RunReceive(c.receive, g_cancel);
  if (*c.resume_cmd) return gpumigrate::cli::RunHeld(c.held, false);
  if (*c.release_cmd) return gpumigrate::cli::RunHeld(c.held, true);
  if (*c.checkpoint_cmd) return gpumigrate::cli::RunCheckpoint(c.checkpoint, g_cancel);
  if (*c.restore_cmd) return gpumigrate::cli::RunRestore(c.restore, g_cancel);
  if (*c.plan_cmd) return gpumigrate::cli::RunPlan(c.plan);
  if (*c.inventory_cmd) return gpumigrate::cli::RunInventory(c.inventory);
  if (*c.cuda_cmd) return gpumigrate::cli::RunCuda(c.cuda);
  if (*c.agent_cmd) return gpumigrate::cli::RunAgent(c.agent, g_cancel);
  if (*c.agent_call_cmd) return gpumigrate::cli::RunAgentCall(c.agent_call);
  if (*c.status_cmd) return gpumigrate::cli::RunStatus(c.status, g_cancel);
  if (*c.evacuate_cmd) return gpumigrate::cli::RunEvacuate(c.evacuate, g_cancel);
  if (*c.content_store_cmd) return gpumigrate::cli::RunContentStore(c.content_store);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "gpumigrate: live migration and checkpointing of GPU-attached VMs.\n"
      "Pre-copies GPU memory while the VM runs, re-sends what changed round by round,\n"
      "then stops it for a short, measured stun.",
      "gpumigrate"};
  SetTopLevelOptions(app);
  CliCommandSet commands;
  AddAllCommands(app, commands);
  if (std::optional<int> rc = ParseCommandLine(app, argc, argv)) return *rc;
  if (*commands.help_cmd) return PrintHelp(app, commands.help_topic);
  InstallSignalHandlers();
  return RunChosenCommand(commands);
}
