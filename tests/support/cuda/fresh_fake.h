// Loads a private copy of libcuda-fake.so (or another library) for one test:
// dlopen of a new path gives a new instance with its own statics (not
// initialised, no allocations, configuration read from the environment now),
// and its own $GPUMIGRATE_FAKE_CUDA_DIR for the checkpoint state file.
// The copy lives in a temporary folder that the FreshFake removes.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <string>

#include "engine/devices/cuda/driver_loader.h"

namespace gpumigrate::cuda::testing {

// Sets an environment variable for one scope (nullptr: unsets it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old, had_ = true;
    if (value != nullptr) setenv(name, value, 1); else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1); else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::string old_;
  bool had_ = false;
};

class FreshFake {
 public:
  // Copies `library` and loads it with `needs`; error() holds LoadDriver's sentence.
  FreshFake(const std::string& library, unsigned needs) {
    char tmpl[] = "/tmp/gm-cuda-fake-XXXXXX";
    const char* dir = mkdtemp(tmpl);
    if (dir == nullptr) {
      error_ = std::string("FreshFake: mkdtemp failed: ") + std::strerror(errno);
      return;
    }
    dir_ = dir;
    const std::filesystem::path copy = std::filesystem::path(dir_) / "libcuda-fake.so";
    std::filesystem::copy_file(library, copy);
    setenv("GPUMIGRATE_LIBCUDA", copy.c_str(), 1);
    setenv("GPUMIGRATE_FAKE_CUDA_DIR", dir_.c_str(), 1);
    error_ = LoadDriver(needs, &driver_);
  }
  ~FreshFake() {
    if (dir_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  FreshFake(const FreshFake&) = delete;
  FreshFake& operator=(const FreshFake&) = delete;

  const std::string& error() const { return error_; }
  const DriverApi& api() const { return driver_.api; }
  const LoadedDriver& driver() const { return driver_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::string error_;
  LoadedDriver driver_;
};

}  // namespace gpumigrate::cuda::testing
