// The QEMU hook's decorators against a scripted QEMU: the QMP sequence each
// device transition sends, QEMU pausing by itself, QEMU failing before the
// pause (no `cont` for a guest that runs), refused capabilities, a destination
// started without -S, and a discarded destination told to quit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "gpumigrate/qemu/qemu.h"
#include "gpumigrate/qemu/qmp.h"
#include "gpumigrate/devices/shm.h"
#include "tests/unit/qemu/scripted_qmp_peer.h"

namespace gpumigrate {
namespace {

using json = nlohmann::json;
using testing::AdoptOrDie;
using testing::FakeQemuIo;
using testing::ScriptedQmpPeer;

class ShmFile {
 public:
  ShmFile() : path_(std::filesystem::temp_directory_path() / ("gm-qemu-guest-" + std::to_string(::getpid()))) {
    std::FILE* f = std::fopen(path_.c_str(), "w");
    std::fseek(f, 64 * 1024 - 1, SEEK_SET);
    std::fputc(0, f);
    std::fclose(f);
  }
  ~ShmFile() { std::filesystem::remove(path_); }
  std::unique_ptr<Device> Open(DeviceRole role) const {
    auto d = ShmDevice::Open({path_.string(), 4096}, role);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? std::unique_ptr<Device>(std::move(*d)) : nullptr;
  }

 private:
  std::filesystem::path path_;
};

QemuHookOptions Options() {
  QemuHookOptions o;
  o.qmp_path = "scripted";
  o.incoming_uri = "unix:/tmp/gm-in.sock";
  o.command_timeout = std::chrono::milliseconds(2000);
  o.converge_timeout = std::chrono::milliseconds(2000);
  o.complete_timeout = std::chrono::milliseconds(2000);
  return o;
}

// What the owner had configured: the hook saves it and puts it back.
void SavedSettings(FakeQemuIo& io) {
  io.Return(io.Expect("query-migrate-capabilities"),
            json::array({{{"capability", "events"}, {"state", false}}, {{"capability", "xbzrle"}, {"state", true}},
                         {{"capability", "x-ignore-shared"}, {"state", false}}}));
  io.Return(io.Expect("query-migrate-parameters"), {{"downtime-limit", 300}, {"max-bandwidth", 134217728}});
}

// The restore: exactly the saved capabilities and parameters.
void Restored(FakeQemuIo& io) {
  json caps = io.Expect("migrate-set-capabilities");
  const json want = json::array({{{"capability", "events"}, {"state", false}},
                                 {{"capability", "x-ignore-shared"}, {"state", false}}});
  if (caps["arguments"]["capabilities"] != want) io.Fail("capabilities not restored: " + caps.dump());
  io.Return(caps, json::object());
  json params = io.Expect("migrate-set-parameters");
  if (params["arguments"] != json({{"downtime-limit", 300}, {"max-bandwidth", 134217728}})) {
    io.Fail("parameters not restored: " + params.dump());
  }
  io.Return(params, json::object());
}

// The source's attach: running, not migrating, caps, downtime-limit held at 0.
void SourceAttach(FakeQemuIo& io) {
  io.Handshake();
  io.Return(io.Expect("query-status"), {{"status", "running"}, {"running", true}});
  io.Return(io.Expect("query-migrate"), json::object());
  SavedSettings(io);
  json caps = io.Expect("migrate-set-capabilities");
  if (caps["arguments"]["capabilities"].size() != 4) io.Fail("expected four capabilities: " + caps.dump());
  io.Return(caps, json::object());
  json params = io.Expect("migrate-set-parameters");
  if (params["arguments"]["downtime-limit"] != 0) io.Fail("downtime-limit not held at 0: " + params.dump());
  io.Return(params, json::object());
}

void ExpectNoFailures(ScriptedQmpPeer& peer) {
  peer.Join();
  EXPECT_EQ(peer.failures(), std::vector<std::string>{});
}

TEST(QemuGuest, SourcePausedByQemuItselfSwitchesAtOnceAndOverlapsTheRestOfRam) {
  ShmFile file;
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    SourceAttach(io);
    json m = io.Expect("migrate");
    if (m["arguments"]["uri"] != "unix:/tmp/gm-in.sock") io.Fail("migrate to the wrong URI: " + m.dump());
    io.Return(m, json::object());
    io.Event("MIGRATION", {{"status", "active"}}, 99);
    io.Event("STOP", json::object(), 100, 500000);
    io.Event("MIGRATION", {{"status", "pre-switchover"}}, 100, 600000);
    io.Return(io.Expect("query-migrate"), {{"status", "pre-switchover"}, {"ram", {{"remaining", 8192}}}});
    io.Return(io.Expect("migrate-continue"), json::object());
    io.Event("MIGRATION", {{"status", "completed"}}, 101);
    io.Return(io.Expect("query-migrate"), {{"status", "completed"}, {"downtime", 42}, {"ram", {{"total", 1000}}}});
    io.Return(io.Expect("query-status"), {{"status", "postmigrate"}, {"running", false}});
  });
  auto guest = QemuGuest::AttachSource(file.Open(DeviceRole::kSource), Options(), AdoptOrDie(peer));
  ASSERT_TRUE(guest.ok()) << guest.status().ToString();
  QemuGuest& g = **guest;
  ASSERT_TRUE(g.SetPeerSetupNote("unix:/tmp/gm-in.sock").ok());
  ASSERT_TRUE(g.SaveSetup().ok());
  ASSERT_TRUE(g.SetState(DeviceState::kPreCopy).ok());
  EXPECT_FALSE(g.SwitchNow()) << "QEMU's migration must not start before the device's round 0";
  g.OnSourcePhase(Phase::kRoundEnd, 0);  // QEMU's RAM migration starts here
  bool now = false;
  for (int i = 0; i < 200 && !now; ++i) {
    now = g.SwitchNow();
    if (!now) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(now) << "QEMU's own pre-switchover must switch the session over";
  ASSERT_TRUE(g.SetState(DeviceState::kStopCopy).ok());  // no downtime-limit change: already paused
  auto blob = g.SaveState();  // waits for "completed"
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  ASSERT_TRUE(g.SetState(DeviceState::kStop).ok());
  QemuFigures f = g.Figures();
  EXPECT_TRUE(f.paused_on_its_own);
  EXPECT_DOUBLE_EQ(f.stop_unix_s, 100.5);
  EXPECT_EQ(f.ram_remaining_at_pause_bytes, 8192u);
  EXPECT_EQ(f.migration_status, "completed");
  EXPECT_EQ(f.run_state, "postmigrate");
  EXPECT_DOUBLE_EQ(f.qemu_downtime_ms, 42);
  ExpectNoFailures(peer);
}

TEST(QemuGuest, SourceQemuFailingBeforeThePauseAbortsNamingItAndTheGuestIsNotContinued) {
  ShmFile file;
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    SourceAttach(io);
    io.Return(io.Expect("migrate"), json::object());
    io.Event("MIGRATION", {{"status", "failed"}});
    json p = io.Expect("migrate-set-parameters");  // the engine's go
    if (p["arguments"]["downtime-limit"] != 300) io.Fail("downtime-limit not raised to the target: " + p.dump());
    io.Return(p, json::object());
    io.Return(io.Expect("query-migrate"), {{"status", "failed"}, {"error-desc", "Unable to write to socket: Broken pipe"}});
    // Rollback: the migration is over and the guest runs: neither cancel nor cont.
    io.Return(io.Expect("query-migrate"), {{"status", "failed"}});
    io.Return(io.Expect("query-status"), {{"status", "running"}, {"running", true}});
    Restored(io);  // the QEMU given back migrates as its owner configured it
    io.DrainUntilClosed();
  });
  auto guest = QemuGuest::AttachSource(file.Open(DeviceRole::kSource), Options(), AdoptOrDie(peer));
  ASSERT_TRUE(guest.ok()) << guest.status().ToString();
  QemuGuest& g = **guest;
  ASSERT_TRUE(g.SetPeerSetupNote("unix:/tmp/gm-in.sock").ok());
  ASSERT_TRUE(g.SaveSetup().ok());
  ASSERT_TRUE(g.SetState(DeviceState::kPreCopy).ok());
  EXPECT_FALSE(g.SwitchNow()) << "QEMU's migration must not start before the device's round 0";
  g.OnSourcePhase(Phase::kRoundEnd, 0);  // QEMU's RAM migration starts here
  Status s = g.SetState(DeviceState::kStopCopy);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("Broken pipe"), std::string::npos) << s.message();
  EXPECT_EQ(g.State(), DeviceState::kPreCopy) << "the device must not stop when QEMU could not pause the guest";
  ASSERT_TRUE(g.SetState(DeviceState::kRunning).ok());
  EXPECT_EQ(g.State(), DeviceState::kRunning);
  guest->reset();  // closes the socket: the peer's drain ends
  ExpectNoFailures(peer);
}

// The rule says go while QEMU still sends RAM: the switchover is held (another
// round) until QEMU reports pre-switchover; the device stops only after that.
TEST(QemuGuest, TheSwitchoverWaitsForQemuToPauseTheGuest) {
  ShmFile file;
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    SourceAttach(io);
    io.Return(io.Expect("migrate"), json::object());
    json p = io.Expect("migrate-set-parameters");
    if (p["arguments"]["downtime-limit"] != 300) io.Fail("downtime-limit not raised to the target: " + p.dump());
    io.Return(p, json::object());
    io.Return(io.Expect("query-migrate"), {{"status", "active"}, {"ram", {{"remaining", 1 << 20}}}});  // the hold's note
    // ...the device runs another round; then QEMU converges.
    io.Event("STOP", json::object(), 300);
    io.Event("MIGRATION", {{"status", "pre-switchover"}}, 300);
    io.Return(io.Expect("query-migrate"), {{"status", "pre-switchover"}, {"ram", {{"remaining", 0}}}});
    io.Return(io.Expect("migrate-continue"), json::object());
    Restored(io);
    io.DrainUntilClosed();
  });
  auto guest = QemuGuest::AttachSource(file.Open(DeviceRole::kSource), Options(), AdoptOrDie(peer));
  ASSERT_TRUE(guest.ok()) << guest.status().ToString();
  QemuGuest& g = **guest;
  ASSERT_TRUE(g.SetPeerSetupNote("unix:/tmp/gm-in.sock").ok());
  ASSERT_TRUE(g.SetState(DeviceState::kPreCopy).ok());
  g.OnSourcePhase(Phase::kRoundEnd, 0);
  EXPECT_FALSE(g.MaySwitch()) << "QEMU has not paused the guest: hold";
  bool go = false;
  for (int i = 0; i < 40 && !go; ++i) go = g.MaySwitch();
  ASSERT_TRUE(go);
  ASSERT_TRUE(g.SetState(DeviceState::kStopCopy).ok());
  EXPECT_EQ(g.State(), DeviceState::kStopCopy);
  guest->reset();
  ExpectNoFailures(peer);
}

TEST(QemuGuest, SourceWithoutAnIncomingUriFromTheReceiverIsRefused) {
  ShmFile file;
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    SourceAttach(io);
    Restored(io);
    io.DrainUntilClosed();
  });
  auto guest = QemuGuest::AttachSource(file.Open(DeviceRole::kSource), Options(), AdoptOrDie(peer));
  ASSERT_TRUE(guest.ok()) << guest.status().ToString();
  Status s = (*guest)->SetPeerSetupNote("");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("receive --qemu"), std::string::npos) << s.message();
  guest->reset();
  ExpectNoFailures(peer);
}

TEST(QemuGuest, CapabilitiesQemuLacksAreRefusedNamingWhatTheHookNeeds) {
  ShmFile file;
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Return(io.Expect("query-status"), {{"status", "running"}, {"running", true}});
    io.Return(io.Expect("query-migrate"), json::object());
    SavedSettings(io);
    io.Error(io.Expect("migrate-set-capabilities"), "GenericError",
             "Parameter 'capability' does not accept value 'x-ignore-shared'");
    Restored(io);  // what was set before the refusal goes back too
    io.DrainUntilClosed();
  });
  auto guest = QemuGuest::AttachSource(file.Open(DeviceRole::kSource), Options(), AdoptOrDie(peer));
  ASSERT_FALSE(guest.ok());
  EXPECT_NE(guest.status().message().find("pause-before-switchover"), std::string::npos) << guest.status().message();
  EXPECT_NE(guest.status().message().find("does not accept value 'x-ignore-shared'"), std::string::npos)
      << guest.status().message();
  ExpectNoFailures(peer);
}

TEST(QemuGuest, ASourceQemuAlreadyMigratingIsRefused) {
  ShmFile file;
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Return(io.Expect("query-status"), {{"status", "running"}, {"running", true}});
    io.Return(io.Expect("query-migrate"), {{"status", "active"}});
    io.DrainUntilClosed();
  });
  auto guest = QemuGuest::AttachSource(file.Open(DeviceRole::kSource), Options(), AdoptOrDie(peer));
  ASSERT_FALSE(guest.ok());
  EXPECT_NE(guest.status().message().find("already migrating (active)"), std::string::npos) << guest.status().message();
  ExpectNoFailures(peer);
}

// The scripted QEMU is this test process (SO_PEERCRED of the socketpair): its
// command line has no -S.
TEST(QemuGuest, ADestinationStartedWithoutDashSIsRefused) {
  ShmFile file;
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Return(io.Expect("query-status"), {{"status", "inmigrate"}, {"running", false}});
    io.DrainUntilClosed();
  });
  auto guest = QemuGuest::AttachDestination(file.Open(DeviceRole::kDestination), Options(), AdoptOrDie(peer));
  ASSERT_FALSE(guest.ok());
  EXPECT_NE(guest.status().message().find("without -S"), std::string::npos) << guest.status().message();
  ExpectNoFailures(peer);
}

void DestinationAttach(FakeQemuIo& io) {
  io.Handshake();
  io.Return(io.Expect("query-status"), {{"status", "inmigrate"}, {"running", false}});
  SavedSettings(io);
  json caps = io.Expect("migrate-set-capabilities");
  if (caps["arguments"]["capabilities"].size() != 3) io.Fail("expected three capabilities: " + caps.dump());
  io.Return(caps, json::object());
}

TEST(QemuGuest, DestinationRunsTheGuestOnlyOnceQemuCompletedAndTheDeviceRuns) {
  ShmFile file;
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    DestinationAttach(io);
    json in = io.Expect("migrate-incoming");
    if (in["arguments"]["uri"] != "unix:/tmp/gm-in.sock") io.Fail("wrong incoming URI: " + in.dump());
    io.Return(in, json::object());
    io.Event("MIGRATION", {{"status", "completed"}});
    io.Return(io.Expect("cont"), json::object());
    io.Event("RESUME", json::object(), 200, 250000);
    Restored(io);  // the guest runs: the incoming-only settings go back
    io.DrainUntilClosed();
  });
  QemuHookOptions o = Options();
  o.require_paused_start = false;
  auto guest = QemuGuest::AttachDestination(file.Open(DeviceRole::kDestination), o, AdoptOrDie(peer));
  ASSERT_TRUE(guest.ok()) << guest.status().ToString();
  QemuGuest& g = **guest;
  ASSERT_TRUE(g.LoadSetup().ok());
  EXPECT_EQ(g.SetupNote(), "unix:/tmp/gm-in.sock");
  ASSERT_TRUE(g.SetState(DeviceState::kResuming).ok());
  ASSERT_TRUE(g.SetState(DeviceState::kStop).ok());
  ASSERT_TRUE(g.SetState(DeviceState::kRunning).ok());
  EXPECT_EQ(g.State(), DeviceState::kRunning);
  EXPECT_FALSE(g.SwitchNow());
  guest->reset();
  ExpectNoFailures(peer);
}

TEST(QemuGuest, ADiscardedDestinationIsToldToQuit) {
  ShmFile file;
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    DestinationAttach(io);
    io.Return(io.Expect("migrate-incoming"), json::object());
    io.Return(io.Expect("quit"), json::object());
    io.Close();
  });
  QemuHookOptions o = Options();
  o.require_paused_start = false;
  auto guest = QemuGuest::AttachDestination(file.Open(DeviceRole::kDestination), o, AdoptOrDie(peer));
  ASSERT_TRUE(guest.ok()) << guest.status().ToString();
  QemuGuest& g = **guest;
  ASSERT_TRUE(g.LoadSetup().ok());
  ASSERT_TRUE(g.SetState(DeviceState::kResuming).ok());
  ASSERT_TRUE(g.SetState(DeviceState::kError).ok());
  EXPECT_EQ(g.Figures().rollback, "quit");
  ExpectNoFailures(peer);
}

}  // namespace
}  // namespace gpumigrate
