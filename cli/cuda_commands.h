// `gpumigrate cuda state|suspend|resume PID`: a CUDA process's checkpoint state
// through the driver's checkpoint API (include/gpumigrate/devices/cuda_checkpoint.h).
//
// Exit codes (the CLI contract): 0 done; 1 failed and the process is RUNNING
// (nothing lost: a lock that timed out, a checkpoint unlocked back, a resume of
// a process that runs); 2 no driver, no such process or no CUDA in it, bad
// flags; 3 failed and the process is held (LOCKED or CHECKPOINTED, memory
// intact) and waits for an operator: `gpumigrate cuda resume PID`.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace gpumigrate::cli {

struct CudaFlags {
  int pid = 0;
  std::string timeout = "10s";
  bool json = false;
  CLI::App* state_cmd = nullptr;
  CLI::App* suspend_cmd = nullptr;
  CLI::App* resume_cmd = nullptr;
};

CLI::App* AddCudaCommand(CLI::App& app, CudaFlags& f);
int RunCuda(const CudaFlags& f);

}  // namespace gpumigrate::cli
