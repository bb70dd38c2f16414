// gpumigrate: the command-line front end. Parses flags, prints progress and
// reports; the work happens in libgpumigrate.
//
// Exit codes (docs/design.md, CLI contract): 0 success; 1 failed and rolled back
// (source running, nothing lost); 2 usage or configuration error; 3 outcome in
// doubt (both sides stopped, source state intact).
#include <csignal>

#include <atomic>
#include <iostream>

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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "gpumigrate: live migration and checkpointing of GPU-attached VMs.\n"
      "Pre-copies GPU memory while the VM runs, re-sends what changed round by round,\n"
      "then stops it for a short, measured stun.",
      "gpumigrate"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("gpumigrate ") + GPUMIGRATE_VERSION);
  app.footer(
      "Exit codes: 0 success; 1 failed and rolled back (source running, nothing lost);\n"
      "2 usage or configuration error; 3 outcome in doubt (both sides stopped, source intact).\n"
      "Sizes: 256MiB, 80GB. Rates: 100Gbit, 2GiB/s, 500MB/s. Durations: 300ms, 100s.");

  gpumigrate::cli::DemoFlags demo;
  CLI::App* demo_cmd = gpumigrate::cli::AddDemoCommand(app, demo);

  gpumigrate::cli::EstimateFlags estimate;
  CLI::App* estimate_cmd = gpumigrate::cli::AddEstimateCommand(app, estimate);

  gpumigrate::cli::MigrateFlags migrate;
  CLI::App* migrate_cmd = gpumigrate::cli::AddMigrateCommand(app, migrate);
  gpumigrate::cli::ReceiveFlags receive;
  CLI::App* receive_cmd = gpumigrate::cli::AddReceiveCommand(app, receive);
  gpumigrate::cli::HeldFlags held;
  CLI::App* resume_cmd = gpumigrate::cli::AddResumeCommand(app, held);
  CLI::App* release_cmd = gpumigrate::cli::AddReleaseCommand(app, held);
  gpumigrate::cli::CheckpointFlags checkpoint;
  CLI::App* checkpoint_cmd = gpumigrate::cli::AddCheckpointCommand(app, checkpoint);
  gpumigrate::cli::RestoreFlags restore;
  CLI::App* restore_cmd = gpumigrate::cli::AddRestoreCommand(app, restore);
  gpumigrate::cli::PlanFlags plan;
  CLI::App* plan_cmd = gpumigrate::cli::AddPlanCommand(app, plan);
  gpumigrate::cli::InventoryFlags inventory;
  CLI::App* inventory_cmd = gpumigrate::cli::AddInventoryCommand(app, inventory);
  gpumigrate::cli::CudaFlags cuda;
  CLI::App* cuda_cmd = gpumigrate::cli::AddCudaCommand(app, cuda);
  gpumigrate::cli::CalibrateFlags calibrate;
  CLI::App* calibrate_cmd = gpumigrate::cli::AddCalibrateCommand(app, calibrate);

  gpumigrate::cli::AgentFlags agent;
  CLI::App* agent_cmd = gpumigrate::cli::AddAgentCommand(app, agent);
  gpumigrate::cli::AgentCallFlags agent_call;
  CLI::App* agent_call_cmd = gpumigrate::cli::AddAgentCallCommand(app, agent_call);

  gpumigrate::cli::EvacuateFlags evacuate;
  CLI::App* evacuate_cmd = gpumigrate::cli::AddEvacuateCommand(app, evacuate);
  gpumigrate::cli::StatusFlags status;
  CLI::App* status_cmd = gpumigrate::cli::AddStatusCommand(app, status);
  gpumigrate::cli::ContentStoreFlags content_store;
  CLI::App* content_store_cmd = gpumigrate::cli::AddContentStoreCommand(app, content_store);

  std::string help_topic;
  CLI::App* help_cmd = app.add_subcommand("help", "Describe a command and every option it takes");
  help_cmd->add_option("command", help_topic, "The command to describe");

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

  if (*help_cmd) return PrintHelp(app, help_topic);

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  // A reader of our stdout or stderr that goes away (`| head`, a log shipper
  // that dies) must not kill a migration mid-way: a guest held for switchover
  // would stay paused. Writes to it fail with EPIPE instead and are dropped;
  // sockets already send with MSG_NOSIGNAL for library users (issue 19).
  std::signal(SIGPIPE, SIG_IGN);
  if (*demo_cmd) return gpumigrate::cli::RunDemo(demo, g_cancel);
  if (*estimate_cmd) return gpumigrate::cli::RunEstimate(estimate);
  if (*calibrate_cmd) return gpumigrate::cli::RunCalibrate(calibrate);
  if (*migrate_cmd) return gpumigrate::cli::RunMigrate(migrate, g_cancel);
  if (*receive_cmd) return gpumigrate::cli::RunReceive(receive, g_cancel);
  if (*resume_cmd) return gpumigrate::cli::RunHeld(held, false);
  if (*release_cmd) return gpumigrate::cli::RunHeld(held, true);
  if (*checkpoint_cmd) return gpumigrate::cli::RunCheckpoint(checkpoint, g_cancel);
  if (*restore_cmd) return gpumigrate::cli::RunRestore(restore, g_cancel);
  if (*plan_cmd) return gpumigrate::cli::RunPlan(plan);
  if (*inventory_cmd) return gpumigrate::cli::RunInventory(inventory);
  if (*cuda_cmd) return gpumigrate::cli::RunCuda(cuda);
  if (*agent_cmd) return gpumigrate::cli::RunAgent(agent, g_cancel);
  if (*agent_call_cmd) return gpumigrate::cli::RunAgentCall(agent_call);
  if (*status_cmd) return gpumigrate::cli::RunStatus(status, g_cancel);
  if (*evacuate_cmd) return gpumigrate::cli::RunEvacuate(evacuate, g_cancel);
  if (*content_store_cmd) return gpumigrate::cli::RunContentStore(content_store);
  return 2;
}
