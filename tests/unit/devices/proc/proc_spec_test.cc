#include <gtest/gtest.h>

#include "gpumigrate/devices/proc.h"

namespace gpumigrate {
namespace {

TEST(ProcSpec, ParsesPidTrackerAndPage) {
  auto s = ParseProcSpec("proc:1234");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->pid, 1234);
  EXPECT_EQ(s->tracker, ProcTracking::kAuto);
  EXPECT_EQ(s->page_size, 0u);
  s = ParseProcSpec("proc:7,tracker=sync-wp,page=64KiB");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->tracker, ProcTracking::kSyncWp);
  EXPECT_EQ(s->page_size, 65536u);
  EXPECT_EQ(s->ToString(), "proc:7,tracker=sync-wp,page=65536");
  EXPECT_EQ(ParseProcSpec(s->ToString())->page_size, 65536u);
  EXPECT_EQ(ParseProcSpec("proc:7,tracker=hash")->tracker, ProcTracking::kHash);
  EXPECT_EQ(ParseProcSpec("proc:7,tracker=pagemap-scan")->tracker, ProcTracking::kPagemapScan);
}

TEST(ProcSpec, RejectsBadInputNamingIt) {
  for (const char* bad : {"proc:", "proc:abc", "proc:-3", "proc:12x", "proc:5,tracker=magic", "proc:5,page=3000",
                          "proc:5,colour=red", "proc:5,tracker", "sim:llm"}) {
    auto s = ParseProcSpec(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find(bad), std::string::npos) << s.status().message();
  }
}

}  // namespace
}  // namespace gpumigrate
