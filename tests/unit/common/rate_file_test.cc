// RateFile: the rate a running migration follows, from a file the agent rewrites.
#include "gpumigrate/common/rate_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;

struct TempFile {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("gm-rate-" + std::to_string(::getpid()) + "-" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                         .string();
  ~TempFile() {
    std::filesystem::remove(path);
    std::filesystem::remove(path + ".tmp");
  }
};

// Polls until `rate` reads `want` (bounded: 5 s).
bool Becomes(const RateFile& f, double want) {
  for (auto until = std::chrono::steady_clock::now() + 5s; std::chrono::steady_clock::now() < until;) {
    if (f.rate()->load() == want) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

TEST(RateFile, FollowsWhatTheFileSays) {
  TempFile t;
  ASSERT_TRUE(WriteRateFile(t.path, "100Mbit").ok());
  auto f = RateFile::Open(t.path, 5ms);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_DOUBLE_EQ((*f)->rate()->load(), 12.5e6);
  ASSERT_TRUE(WriteRateFile(t.path, "25MB/s").ok());
  EXPECT_TRUE(Becomes(**f, 25e6));
  ASSERT_TRUE(WriteRateFile(t.path, "0").ok());
  EXPECT_TRUE(Becomes(**f, 0)) << "0: unlimited";
  EXPECT_EQ((*f)->changes(), 2u);
}

TEST(RateFile, ABadOrMissingFileLaterKeepsTheRateAndAtOpenIsAnError) {
  TempFile t;
  auto none = RateFile::Open(t.path);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find(t.path), std::string::npos) << none.status().message();
  {
    std::ofstream(t.path) << "fast\n";
  }
  auto bad = RateFile::Open(t.path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("rate file"), std::string::npos) << bad.status().message();

  ASSERT_TRUE(WriteRateFile(t.path, "1MB/s").ok());
  auto f = RateFile::Open(t.path, 5ms);
  ASSERT_TRUE(f.ok());
  {
    std::ofstream(t.path) << "-3MB/s\n";
  }
  std::this_thread::sleep_for(50ms);
  EXPECT_DOUBLE_EQ((*f)->rate()->load(), 1e6);
  std::filesystem::remove(t.path);
  std::this_thread::sleep_for(50ms);
  EXPECT_DOUBLE_EQ((*f)->rate()->load(), 1e6);
  EXPECT_EQ((*f)->changes(), 0u);
}

}  // namespace
}  // namespace gpumigrate
