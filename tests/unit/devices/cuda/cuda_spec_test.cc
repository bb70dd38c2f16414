#include <gtest/gtest.h>

#include "gpumigrate/devices/cuda.h"
#include "gpumigrate/devices/proc.h"

namespace gpumigrate {
namespace {

TEST(CudaSpec, ParsesPidPageAndHash) {
  auto s = ParseCudaSpec("cuda:1234");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->pid, 1234);
  EXPECT_EQ(s->page_size, 64u << 10);
  EXPECT_EQ(s->hash, CudaHash::kAuto);
  EXPECT_EQ(s->ToString(), "cuda:1234");
  s = ParseCudaSpec("cuda:7,page=1MiB,hash=host");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->page_size, 1u << 20);
  EXPECT_EQ(s->hash, CudaHash::kHost);
  EXPECT_EQ(s->ToString(), "cuda:7,page=1048576,hash=host");
  EXPECT_EQ(ParseCudaSpec(s->ToString())->page_size, 1u << 20);
  EXPECT_EQ(ParseCudaSpec("cuda:7,hash=gpu")->hash, CudaHash::kGpu);
  EXPECT_EQ(ParseCudaSpec("cuda:7,page=2KiB")->page_size, 2048u);
}

TEST(CudaSpec, RejectsBadInputNamingIt) {
  for (const char* bad : {"cuda:", "cuda:abc", "cuda:-3", "cuda:5,hash=fpga", "cuda:5,page=3000", "cuda:5,page=1KiB",
                          "cuda:5,page=2MiB", "cuda:5,tracker=hash", "cuda:5,hash", "proc:5"}) {
    auto s = ParseCudaSpec(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find(bad), std::string::npos) << s.status().message();
    EXPECT_NE(s.status().message().find("cuda:PID"), std::string::npos) << s.status().message();
  }
}

TEST(CudaSpec, BecomesAProcSpecThatRequiresCudaRegions) {
  auto s = ParseCudaSpec("cuda:42,page=128KiB,hash=gpu");
  ASSERT_TRUE(s.ok());
  ProcSpec p = ProcSpecForCuda(*s);
  EXPECT_EQ(p.pid, 42);
  EXPECT_TRUE(p.cuda);
  EXPECT_EQ(p.cuda_page_size, 128u << 10);
  EXPECT_EQ(p.cuda_hash, CudaHash::kGpu);
  EXPECT_EQ(p.page_size, 0u);  // host regions keep the system page
  EXPECT_EQ(p.ToString(), "cuda:42,page=131072,hash=gpu");
}

}  // namespace
}  // namespace gpumigrate
