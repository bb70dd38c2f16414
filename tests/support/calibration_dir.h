// For tests of the stored calibrations: an environment variable set (or unset)
// for a scope, and a fixture that points $GPUMIGRATE_CALIBRATION at
// DIR/calibration.json in a fresh temporary directory for each test, so the
// path calibration file (DIR/calibration-paths.json) is the test's own too.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace gpumigrate::testing {

class ScopedEnv {
 public:
  // nullptr: unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? (void)setenv(name, value, 1) : (void)unsetenv(name);
  }
  ~ScopedEnv() { old_ ? (void)setenv(name_, old_->c_str(), 1) : (void)unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

class CalibrationDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "gm_calibration_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = (dir_ / "calibration.json").string();
    env_.emplace("GPUMIGRATE_CALIBRATION", path_.c_str());
  }
  void TearDown() override {
    env_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::filesystem::path dir_;
  std::string path_;  // the calibration file; its path calibration file is beside it

 private:
  std::optional<ScopedEnv> env_;
};

}  // namespace gpumigrate::testing
