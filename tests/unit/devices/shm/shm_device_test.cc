// The shm backend against real files: spec parsing, bounds, hashing that sees
// writes made through another descriptor and through a shared mapping (as a
// QEMU guest writes), in-place writes on the destination, and discard.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <xxhash.h>

#include "gpumigrate/common/bitmap.h"
#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/shm.h"

namespace gpumigrate {
namespace {

class ShmFile {
 public:
  explicit ShmFile(uint64_t size) {
    char tmpl[] = "/dev/shm/gm-shm-test-XXXXXX";
    int fd = ::mkstemp(tmpl);
    if (fd < 0) {
      std::strcpy(tmpl, "/tmp/gm-shm-test-XXXXXX");
      fd = ::mkstemp(tmpl);
    }
    path_ = tmpl;
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    ::close(fd);
  }
  ~ShmFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }
  void Put(uint64_t offset, std::string_view text) const {
    int fd = ::open(path_.c_str(), O_RDWR);
    ASSERT_EQ(::pwrite(fd, text.data(), text.size(), static_cast<off_t>(offset)), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }

 private:
  std::string path_;
};

std::string ReadString(Device& d, uint64_t offset, size_t n) {
  std::string s(n, '\0');
  Status st = d.Read(0, offset, std::as_writable_bytes(std::span(s.data(), s.size())));
  EXPECT_TRUE(st.ok()) << st.ToString();
  return s;
}

TEST(ShmSpec, ParsesPathAndPage) {
  auto s = ParseShmSpec("shm:/dev/shm/gm-vm1,page=64KiB");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->path, "/dev/shm/gm-vm1");
  EXPECT_EQ(s->page_size, 64u * 1024);
  EXPECT_EQ(s->ToString(), "shm:/dev/shm/gm-vm1,page=65536");
  auto d = ParseShmSpec("shm:/dev/shm/x");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->page_size, 4096u);
  EXPECT_EQ(d->ToString(), "shm:/dev/shm/x");
}

TEST(ShmSpec, RefusesBadSpecsByName) {
  for (const char* bad : {"shm:", "shm:page=4096", "shm:/x,page=1000", "shm:/x,page=512", "shm:/x,page=4MiB",
                          "shm:/x,color=red", "shm:/x,flag", "sim:/x"}) {
    auto s = ParseShmSpec(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find(bad), std::string::npos) << s.status().message();
  }
}

TEST(ShmDevice, OpenRefusesMissingEmptyAndNonRegularFiles) {
  auto missing = ShmDevice::Open({"/dev/shm/gm-no-such-file-here", 4096}, DeviceRole::kDestination);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("start that QEMU first"), std::string::npos) << missing.status().message();
  ShmFile empty(0);
  auto e = ShmDevice::Open({empty.path(), 4096}, DeviceRole::kSource);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("at least one 4096-byte page"), std::string::npos) << e.status().message();
  auto dir = ShmDevice::Open({"/tmp", 4096}, DeviceRole::kSource);
  ASSERT_FALSE(dir.ok());
}

TEST(ShmDevice, SourceReadsTheFileAndRefusesWrites) {
  ShmFile f(64 * 1024);
  f.Put(4096, "weights");
  auto dev = ShmDevice::Open({f.path(), 4096}, DeviceRole::kSource);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  Device& d = **dev;
  EXPECT_EQ(d.State(), DeviceState::kRunning);
  ASSERT_EQ(d.Regions().size(), 1u);
  EXPECT_EQ(d.Regions()[0].size_bytes, 64u * 1024);
  EXPECT_EQ(d.Regions()[0].pages(), 16u);
  EXPECT_EQ(ReadString(d, 4096, 7), "weights");
  std::vector<std::byte> buf(16);
  EXPECT_FALSE(d.Read(0, 64 * 1024 - 8, buf).ok());  // crosses the end
  EXPECT_FALSE(d.Read(1, 0, buf).ok());              // no such region
  Status w = d.Write(0, 0, buf);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.message().find("read-only"), std::string::npos) << w.message();
}

TEST(ShmDevice, HashTrackerSeesWritesThroughASharedMapping) {
  ShmFile f(16 * 4096);
  auto dev = ShmDevice::Open({f.path(), 4096}, DeviceRole::kSource);
  ASSERT_TRUE(dev.ok());
  DirtyTracker* t = (*dev)->Tracker();
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->Start().ok());
  // The "guest": another mapping of the same file, as QEMU's share=on backend.
  int fd = ::open(f.path().c_str(), O_RDWR);
  void* m = ::mmap(nullptr, 16 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  static_cast<char*>(m)[3 * 4096 + 17] = 1;
  static_cast<char*>(m)[9 * 4096] = 2;
  DirtyBitmap dirty(16);
  ASSERT_TRUE(t->Sync(0, dirty).ok());
  std::vector<uint64_t> got;
  for (uint64_t p = 0; p < 16; ++p) {
    if (dirty.Test(p)) got.push_back(p);
  }
  EXPECT_EQ(got, (std::vector<uint64_t>{3, 9}));
  DirtyBitmap again(16);
  ASSERT_TRUE(t->Sync(0, again).ok());  // read-and-clear: nothing new
  EXPECT_EQ(again.Count(), 0u);
  ::munmap(m, 16 * 4096);
  ::close(fd);
  ASSERT_TRUE(t->Stop().ok());
}

// The ABA case: the session sent a page while it held Y; the guest then writes
// back the content the previous sync hashed. Only NoteSent (what was sent) lets
// the tracker see that as a change.
TEST(ShmDevice, HashTrackerSeesAPageWrittenBackToItsEarlierContentAfterTheSend) {
  ShmFile f(4 * 4096);
  auto dev = ShmDevice::Open({f.path(), 4096}, DeviceRole::kSource);
  ASSERT_TRUE(dev.ok());
  DirtyTracker* t = (*dev)->Tracker();
  ASSERT_TRUE(t->Start().ok());  // page 2 hashed as zeros
  f.Put(2 * 4096, "Y");           // written after the sync...
  std::vector<std::byte> sent(4096);
  ASSERT_TRUE((*dev)->Read(0, 2 * 4096, sent).ok());  // ...and read for sending
  const uint64_t h = XXH3_64bits(sent.data(), sent.size());
  t->NoteSent(0, 2, std::span<const uint64_t>(&h, 1));
  f.Put(2 * 4096, std::string(1, '\0'));  // back to what Start() hashed
  DirtyBitmap dirty(4);
  ASSERT_TRUE(t->Sync(0, dirty).ok());
  EXPECT_TRUE(dirty.Test(2)) << "the destination holds Y; the source page is zero again";
  ASSERT_TRUE(t->Stop().ok());
  t->NoteSent(0, 2, std::span<const uint64_t>(&h, 1));  // after Stop: ignored, no crash
}

TEST(ShmDevice, DestinationWritesInPlaceWithoutTruncating) {
  ShmFile f(8 * 4096);
  struct stat before {};
  ASSERT_EQ(::stat(f.path().c_str(), &before), 0);
  // What the destination QEMU holds mapped.
  int fd = ::open(f.path().c_str(), O_RDWR);
  auto* m = static_cast<char*>(::mmap(nullptr, 8 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(m, MAP_FAILED);
  auto dev = ShmDevice::Open({f.path(), 4096}, DeviceRole::kDestination);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  Device& d = **dev;
  EXPECT_EQ(d.State(), DeviceState::kStop);
  ASSERT_TRUE(d.SetState(DeviceState::kResuming).ok());
  std::string text = "kv-cache";
  ASSERT_TRUE(d.Write(0, 2 * 4096 + 5, std::as_bytes(std::span(text.data(), text.size()))).ok());
  EXPECT_EQ(std::string(m + 2 * 4096 + 5, 8), "kv-cache");  // the mapping sees it
  std::memset(m + 5 * 4096, 0x5a, 4096);
  ASSERT_TRUE(d.WriteZeros(0, 4 * 4096, 2 * 4096).ok());
  EXPECT_EQ(m[5 * 4096 + 100], 0);
  EXPECT_FALSE(d.Write(0, 8 * 4096 - 2, std::as_bytes(std::span(text.data(), text.size()))).ok());
  EXPECT_FALSE(d.LoadState(std::as_bytes(std::span(text.data(), 1))).ok());
  EXPECT_TRUE(d.LoadState({}).ok());
  struct stat after {};
  ASSERT_EQ(::stat(f.path().c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(after.st_size, before.st_size);
  ::munmap(m, 8 * 4096);
  ::close(fd);
}

TEST(ShmDevice, DiscardZeroesWhatArrived) {
  ShmFile f(4 * 4096);
  auto dev = ShmDevice::Open({f.path(), 4096}, DeviceRole::kDestination);
  ASSERT_TRUE(dev.ok());
  Device& d = **dev;
  ASSERT_TRUE(d.SetState(DeviceState::kResuming).ok());
  std::string text = "half a guest";
  ASSERT_TRUE(d.Write(0, 4096, std::as_bytes(std::span(text.data(), text.size()))).ok());
  ASSERT_TRUE(d.SetState(DeviceState::kError).ok());
  EXPECT_EQ(ReadString(d, 4096, text.size()), std::string(text.size(), '\0'));
}

TEST(ShmDevice, AFileTruncatedUnderTheSourceIsANamedError) {
  ShmFile f(8 * 4096);
  auto dev = ShmDevice::Open({f.path(), 4096}, DeviceRole::kSource);
  ASSERT_TRUE(dev.ok());
  ASSERT_EQ(::truncate(f.path().c_str(), 4096), 0);
  std::vector<std::byte> buf(4096);
  Status s = (*dev)->Read(0, 4 * 4096, buf);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
}

TEST(ShmDevice, StateMachineFollowsTheVfioArcs) {
  ShmFile f(4096);
  auto src = ShmDevice::Open({f.path(), 4096}, DeviceRole::kSource);
  ASSERT_TRUE(src.ok());
  Device& d = **src;
  EXPECT_FALSE(d.SaveState().ok());  // not in STOP_COPY
  EXPECT_FALSE(d.SetState(DeviceState::kResuming).ok());
  ASSERT_TRUE(d.SetState(DeviceState::kPreCopy).ok());
  ASSERT_TRUE(d.SetState(DeviceState::kStopCopy).ok());
  auto blob = d.SaveState();
  ASSERT_TRUE(blob.ok());
  EXPECT_TRUE(blob->empty());
  ASSERT_TRUE(d.SetState(DeviceState::kRunning).ok());  // rollback
}

}  // namespace
}  // namespace gpumigrate

namespace gpumigrate {
namespace {

// A released source's file is zeroed (it was opened read-only for the
// migration: the scrub reopens it, checked by inode).
TEST(ShmDevice, ScrubZeroesTheSourcesFile) {
  ShmFile f(64 * 1024);
  f.Put(0, "weights");
  f.Put(60 * 1024, "kv cache");
  auto dev = ShmDevice::Open({f.path(), 4096}, DeviceRole::kSource);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  ASSERT_TRUE((*dev)->SetState(DeviceState::kPreCopy).ok());
  ASSERT_TRUE((*dev)->SetState(DeviceState::kStopCopy).ok());
  ASSERT_TRUE((*dev)->SetState(DeviceState::kStop).ok());
  Status st = (*dev)->Scrub();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ReadString(**dev, 0, 7), std::string(7, '\0'));
  EXPECT_EQ(ReadString(**dev, 60 * 1024, 8), std::string(8, '\0'));
  struct stat sb {};
  ASSERT_EQ(::stat(f.path().c_str(), &sb), 0);
  EXPECT_EQ(sb.st_size, 64 * 1024) << "the file keeps its size (QEMU still maps it)";
}

TEST(ShmDevice, ScrubTouchesNoFilePutInThePlaceOfTheMigratedOne) {
  ShmFile f(16 * 1024);
  f.Put(0, "old");
  auto dev = ShmDevice::Open({f.path(), 4096}, DeviceRole::kSource);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  std::filesystem::remove(f.path());
  {
    int fd = ::open(f.path().c_str(), O_RDWR | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, "new", 3, 0), 3);
    ::close(fd);
  }
  Status st = (*dev)->Scrub();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("another file"), std::string::npos) << st.message();
  int fd = ::open(f.path().c_str(), O_RDONLY);
  char buf[3] = {};
  ASSERT_EQ(::pread(fd, buf, 3, 0), 3);
  ::close(fd);
  EXPECT_EQ(std::string(buf, 3), "new");
}

}  // namespace
}  // namespace gpumigrate
