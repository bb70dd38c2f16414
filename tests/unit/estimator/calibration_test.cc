// Stored calibration: where it lives, reading it back, and a clear error (never a
// crash) for a missing or damaged file. Each test points $GPUMIGRATE_CALIBRATION
// at its own temporary directory and puts the environment back afterwards.
#include "gpumigrate/estimator/calibration.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include <gtest/gtest.h>

#include "tests/support/calibration_dir.h"

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;

using testing::ScopedEnv;

class CalibrationFile : public testing::CalibrationDirTest {
 protected:
  void Write(const std::string& text) {
    std::ofstream out(path_);
    out << text;
  }
};

constexpr const char* kGood = R"({
  "version": 1,
  "fixed_cost_ms": 12.5,
  "inprocess_bytes_per_s": 2000000000.0,
  "inprocess_low_bytes_per_s": 1500000000.0,
  "inprocess_high_bytes_per_s": 2500000000.0,
  "measured_at": "2024-05-01T10:00:00Z",
  "method": "test"
})";

TEST_F(CalibrationFile, TheEnvironmentNamesThePath) {
  EXPECT_EQ(DefaultCalibrationPath(), path_);
  ScopedEnv none("GPUMIGRATE_CALIBRATION", nullptr);
  ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
  EXPECT_EQ(DefaultCalibrationPath(), "/xdg/gpumigrate/calibration.json");
  ScopedEnv no_xdg("XDG_CACHE_HOME", nullptr);
  ScopedEnv home("HOME", "/home/u");
  EXPECT_EQ(DefaultCalibrationPath(), "/home/u/.cache/gpumigrate/calibration.json");
}

TEST_F(CalibrationFile, LoadsEveryFieldOfAStoredFile) {
  Write(kGood);
  auto c = LoadStoredCalibration();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->fixed_cost_ms, 12.5);
  EXPECT_EQ(c->inprocess_bytes_per_s, 2e9);
  EXPECT_EQ(c->inprocess_low_bytes_per_s, 1.5e9);
  EXPECT_EQ(c->inprocess_high_bytes_per_s, 2.5e9);
  EXPECT_EQ(c->measured_at, "2024-05-01T10:00:00Z");
  EXPECT_EQ(c->path, path_);
  EXPECT_FALSE(c->measured_now);
}

TEST_F(CalibrationFile, LowAndHighDefaultToTheMedian) {
  Write(R"({"version": 1, "fixed_cost_ms": 0, "inprocess_bytes_per_s": 1000})");
  auto c = LoadStoredCalibration();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->fixed_cost_ms, 0.0);
  EXPECT_EQ(c->inprocess_low_bytes_per_s, 1000.0);
  EXPECT_EQ(c->inprocess_high_bytes_per_s, 1000.0);
  EXPECT_EQ(c->measured_at, "");
}

TEST_F(CalibrationFile, LoadOrCalibrateUsesAStoredFileWithoutMeasuring) {
  Write(kGood);
  auto c = LoadOrCalibrate(/*force=*/false);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->measured_now);
  EXPECT_EQ(c->fixed_cost_ms, 12.5);
}

TEST_F(CalibrationFile, AMissingFileIsUnavailableAndNamesThePath) {
  auto c = LoadStoredCalibration();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(c.status().message(), "calibration: no stored calibration at " + path_);
}

TEST_F(CalibrationFile, DamagedFilesAreCorruptWithAClearMessage) {
  const std::string not_v1 = "calibration: " + path_ + " is not a version 1 calibration file";
  const std::string no_figures = "calibration: " + path_ + " lacks its figures";
  const std::string truncated = std::string(kGood).substr(0, 60);
  const struct {
    std::string text;
    const std::string& want;
  } cases[] = {
      {"", not_v1},
      {"not json at all", not_v1},
      {truncated, not_v1},
      {"[1, 2, 3]", not_v1},
      {R"({"version": 2, "fixed_cost_ms": 1, "inprocess_bytes_per_s": 1})", not_v1},
      {R"({"fixed_cost_ms": 1, "inprocess_bytes_per_s": 1})", not_v1},
      {R"({"version": 1, "inprocess_bytes_per_s": 1})", no_figures},
      {R"({"version": 1, "fixed_cost_ms": 1})", no_figures},
      {R"({"version": 1, "fixed_cost_ms": -1, "inprocess_bytes_per_s": 1})", no_figures},
      {R"({"version": 1, "fixed_cost_ms": 1, "inprocess_bytes_per_s": 0})", no_figures},
  };
  for (const auto& c : cases) {
    Write(c.text);
    auto got = LoadStoredCalibration();
    ASSERT_FALSE(got.ok()) << c.text;
    EXPECT_EQ(got.status().code(), StatusCode::kCorrupt) << c.text;
    EXPECT_EQ(got.status().message(), c.want) << c.text;
  }
}

// JSON that parses but holds a field of the wrong type is a damaged file too: an
// error, not an exception out of the loader.
TEST_F(CalibrationFile, FieldsOfTheWrongTypeAreCorruptNotAnException) {
  const char* cases[] = {
      R"({"version": "1", "fixed_cost_ms": 1, "inprocess_bytes_per_s": 1})",
      R"({"version": 1, "fixed_cost_ms": "1", "inprocess_bytes_per_s": 1})",
      R"({"version": 1, "fixed_cost_ms": 1, "inprocess_bytes_per_s": null})",
      R"({"version": 1, "fixed_cost_ms": 1, "inprocess_bytes_per_s": 1, "measured_at": 5})",
  };
  const std::string want_prefix = "calibration: " + path_ + " is damaged: ";
  for (const char* text : cases) {
    Write(text);
    Result<Calibration> got = Internal("not loaded");
    try {
      got = LoadStoredCalibration();
    } catch (const std::exception& e) {
      ADD_FAILURE() << text << " threw " << e.what();
      continue;
    }
    ASSERT_FALSE(got.ok()) << text;
    EXPECT_EQ(got.status().code(), StatusCode::kCorrupt) << text;
    EXPECT_EQ(got.status().message().rfind(want_prefix, 0), 0u) << got.status().message();
  }
}

}  // namespace
}  // namespace gpumigrate
