// LoadDriver's failures, each named in words: no library, a file that is not a
// library, a driver without the checkpoint API, one too old for it, and the
// CUDA toolkit's stub library.
#include "engine/devices/cuda/driver_loader.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/support/cuda/fresh_fake.h"

namespace gpumigrate::cuda {
namespace {

using testing::FreshFake;
using testing::ScopedEnv;

constexpr unsigned kAll = kNeedCore | kNeedMemory | kNeedModule | kNeedCheckpoint;

TEST(DriverLoader, PathIsTheEnvironmentsOrLibcudaSo1) {
  {
    ScopedEnv env("GPUMIGRATE_LIBCUDA", nullptr);
    EXPECT_EQ(DriverPath(), "libcuda.so.1");
  }
  ScopedEnv env("GPUMIGRATE_LIBCUDA", "/x/libcuda.so");
  EXPECT_EQ(DriverPath(), "/x/libcuda.so");
}

TEST(DriverLoader, NoLibraryNamesThePathAndTheRemedy) {
  ScopedEnv env("GPUMIGRATE_LIBCUDA", "/nonexistent/gpumigrate/libcuda.so.1");
  LoadedDriver d;
  const std::string e = LoadDriver(kNeedCore, &d);
  EXPECT_NE(e.find("could not be loaded (/nonexistent/gpumigrate/libcuda.so.1)"), std::string::npos) << e;
  EXPECT_NE(e.find("GPUMIGRATE_LIBCUDA"), std::string::npos) << e;
}

TEST(DriverLoader, AFileThatIsNotALibraryIsRefused) {
  const auto path = std::filesystem::temp_directory_path() / ("gm-not-a-library-" + std::to_string(getpid()) + ".so");
  std::ofstream(path) << "this is text, not ELF\n";
  ScopedEnv env("GPUMIGRATE_LIBCUDA", path.c_str());
  LoadedDriver d;
  const std::string e = LoadDriver(kNeedCore, &d);
  std::filesystem::remove(path);
  EXPECT_NE(e.find("could not be loaded (" + path.string() + ")"), std::string::npos) << e;
}

TEST(DriverLoader, TheFakeLoadsWithEverything) {
  FreshFake fake(GM_CUDA_FAKE, kAll);
  ASSERT_EQ(fake.error(), "");
  EXPECT_EQ(fake.driver().version, 13000);
  EXPECT_NE(fake.api().cuCheckpointProcessGetRestoreThreadId, nullptr);
  EXPECT_NE(fake.api().cuLaunchKernel, nullptr);
}

TEST(DriverLoader, ADriverWithoutTheCheckpointApiNamesTheMissingSymbol) {
  FreshFake old(GM_CUDA_FAKE_OLD, kAll);
  EXPECT_NE(old.error().find("lacks cuCheckpointProcessGetState"), std::string::npos) << old.error();
  EXPECT_NE(old.error().find("driver 570"), std::string::npos) << old.error();
  FreshFake old_without_need(GM_CUDA_FAKE_OLD, kNeedCore | kNeedMemory | kNeedModule);
  EXPECT_EQ(old_without_need.error(), "");
}

TEST(DriverLoader, ADriverTooOldForTheCheckpointApiSaysBothVersions) {
  ScopedEnv env("GPUMIGRATE_FAKE_CUDA_VERSION", "12040");
  FreshFake fake(GM_CUDA_FAKE, kAll);
  EXPECT_NE(fake.error().find("is version 12.4"), std::string::npos) << fake.error();
  EXPECT_NE(fake.error().find("needs 12.8"), std::string::npos) << fake.error();
  FreshFake without_checkpoint(GM_CUDA_FAKE, kNeedCore | kNeedMemory);
  EXPECT_EQ(without_checkpoint.error(), "");
  EXPECT_EQ(without_checkpoint.driver().version, 12040);
}

TEST(DriverLoader, TheToolkitStubIsNamedAsOne) {
  std::string stub;
  for (const char* p : {"/usr/local/cuda/lib64/stubs/libcuda.so", "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so"}) {
    if (std::filesystem::exists(p)) stub = p;
  }
  if (stub.empty()) GTEST_SKIP() << "no CUDA toolkit stub libcuda.so installed";
  ScopedEnv env("GPUMIGRATE_LIBCUDA", stub.c_str());
  LoadedDriver d;
  const std::string e = LoadDriver(kNeedCore, &d);
  EXPECT_NE(e.find("cuDriverGetVersion failed"), std::string::npos) << e;
  EXPECT_NE(e.find("34"), std::string::npos) << e;
  EXPECT_NE(e.find("stub library"), std::string::npos) << e;
}

TEST(DriverLoader, ResultTextNamesKnownAndUnknownCodes) {
  FreshFake fake(GM_CUDA_FAKE, kNeedCore);
  ASSERT_EQ(fake.error(), "");
  EXPECT_EQ(ResultText(fake.api(), CUDA_ERROR_OUT_OF_MEMORY), "CUDA_ERROR_OUT_OF_MEMORY (out of memory)");
  EXPECT_EQ(ResultText(fake.api(), 12345), "CUresult 12345");
  EXPECT_EQ(VersionText(12080), "12.8");
}

}  // namespace
}  // namespace gpumigrate::cuda
