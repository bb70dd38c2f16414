// CudaDriver: one load per path and needs, failures not kept, and Check's
// sentence and code for each kind of driver error.
#include "engine/devices/cuda/driver.h"

#include <gtest/gtest.h>

#include "tests/support/cuda/fresh_fake.h"

namespace gpumigrate::cuda {
namespace {

using testing::ScopedEnv;

TEST(CudaDriver, LoadsOncePerPathAndKeepsNoFailure) {
  {
    ScopedEnv none("GPUMIGRATE_LIBCUDA", "/nonexistent/libcuda.so.1");
    auto d = CudaDriver::Load(kNeedCore);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(d.status().message().find("cuda: the CUDA driver could not be loaded"), std::string::npos)
        << d.status().message();
  }
  ScopedEnv fake("GPUMIGRATE_LIBCUDA", GM_CUDA_FAKE);
  auto core = CudaDriver::Load(kNeedCore);
  ASSERT_TRUE(core.ok()) << core.status().message();
  auto again = CudaDriver::Load(kNeedCore);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*core, *again);
  auto more = CudaDriver::Load(kNeedCore | kNeedCheckpoint);
  ASSERT_TRUE(more.ok()) << more.status().message();
  EXPECT_NE(more.value()->api().cuCheckpointProcessLock, nullptr);
  auto fewer = CudaDriver::Load(kNeedCheckpoint);  // a load that resolved more serves it
  ASSERT_TRUE(fewer.ok());
  EXPECT_EQ(*fewer, *more);
  EXPECT_EQ((*core)->path(), GM_CUDA_FAKE);
}

TEST(CudaDriver, CheckNamesTheCallAndTheError) {
  ScopedEnv fake("GPUMIGRATE_LIBCUDA", GM_CUDA_FAKE);
  auto d = CudaDriver::Load(kNeedCore);
  ASSERT_TRUE(d.ok()) << d.status().message();
  const CudaDriver& drv = **d;
  EXPECT_TRUE(drv.Check(CUDA_SUCCESS, "cuInit").ok());
  Status st = drv.Check(CUDA_ERROR_ILLEGAL_STATE, "cuCheckpointProcessUnlock");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "cuCheckpointProcessUnlock failed: CUDA_ERROR_ILLEGAL_STATE (the operation cannot be performed in the "
            "present state)");
  EXPECT_EQ(drv.Check(CUDA_ERROR_TIMEOUT, "x").code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(drv.Check(CUDA_ERROR_INVALID_VALUE, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(drv.Check(CUDA_ERROR_OUT_OF_MEMORY, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(drv.Check(CUDA_ERROR_NOT_SUPPORTED, "x").code(), StatusCode::kUnimplemented);
  EXPECT_EQ(drv.Check(12345, "cuX").message(), "cuX failed: CUresult 12345");
}

}  // namespace
}  // namespace gpumigrate::cuda
