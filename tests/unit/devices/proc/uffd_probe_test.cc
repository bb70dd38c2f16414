#include "engine/devices/proc/uffd_probe.h"

#include <gtest/gtest.h>

#include "engine/devices/proc/trackers.h"

namespace gpumigrate::proc {
namespace {

// Either answer is right for some kernel; what must hold is that the probe says
// which call failed and why, or gives features, and that the engine's kernel
// probe reports the same.
TEST(UffdProbe, ReportsFeaturesOrTheFailedCall) {
  const UffdProbe p = ProbeUffdFeatures();
  const KernelTracking k = ProbeKernelTracking();
  EXPECT_EQ(k.userfaultfd, p.ok());
  if (p.ok()) {
    EXPECT_EQ(p.error, 0);
    EXPECT_EQ(k.uffd_features, p.features);
  } else {
    EXPECT_NE(p.error, 0);
    EXPECT_EQ(p.features, 0u);
    const std::string call = p.failed_call;
    EXPECT_TRUE(call == "userfaultfd" || call == "UFFDIO_API") << call;
    EXPECT_NE(k.detail.find(call == "userfaultfd" ? "userfaultfd()" : "UFFDIO_API"), std::string::npos) << k.detail;
  }
}

}  // namespace
}  // namespace gpumigrate::proc
