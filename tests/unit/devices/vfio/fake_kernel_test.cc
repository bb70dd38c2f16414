// The fake kernel's file table: what every fake VFIO/iommufd file relies on.
#include "tests/support/vfio/fake_kernel.h"

#include <fcntl.h>

#include <cerrno>

#include <gtest/gtest.h>

namespace gpumigrate::vfio::fake {
namespace {

struct Counting : File {
  int* closed;
  explicit Counting(int* c) : closed(c) {}
  int Ioctl(FakeKernel&, unsigned long request, void*) override { return static_cast<int>(request); }
  void OnClose(FakeKernel&) override { ++*closed; }
};

TEST(FakeKernel, OpensOnlyRegisteredPathsAndClosesEachFdOnce) {
  FakeKernel k;
  int closed = 0;
  k.Add("/dev/vfio/devices/vfio0", [&] { return std::make_shared<Counting>(&closed); });
  EXPECT_EQ(k.Open("/dev/vfio/devices/vfio1", O_RDWR), -ENOENT);
  int fd = k.Open("/dev/vfio/devices/vfio0", O_RDWR);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(k.Ioctl(fd, 7, nullptr), 7);
  EXPECT_EQ(k.OpenFds(), 1u);
  EXPECT_EQ(k.Close(fd), 0);
  EXPECT_EQ(closed, 1);
  EXPECT_EQ(k.Close(fd), -EBADF);
  EXPECT_EQ(k.Ioctl(fd, 7, nullptr), -EBADF);
  EXPECT_EQ(closed, 1);
}

TEST(FakeKernel, UnsupportedCallsAnswerAsTheKernelWould) {
  FakeKernel k;
  int fd = k.Install(std::make_shared<File>());
  char b[4];
  EXPECT_EQ(k.Ioctl(fd, 1, nullptr), -ENOTTY);
  EXPECT_EQ(k.Read(fd, b, sizeof b), -EINVAL);
  EXPECT_EQ(k.Write(fd, b, sizeof b), -EINVAL);
  int err = 0;
  EXPECT_EQ(k.Mmap(4096, 0, 0, fd, 0, &err), nullptr);
  EXPECT_EQ(err, ENODEV);
}

TEST(RealKernel, ReportsErrnoAsNegativeValues) {
  EXPECT_EQ(RealKernel().Open("/nonexistent/gpumigrate/vfio0", O_RDWR), -ENOENT);
  EXPECT_EQ(RealKernel().Close(-1), -EBADF);
}

}  // namespace
}  // namespace gpumigrate::vfio::fake
