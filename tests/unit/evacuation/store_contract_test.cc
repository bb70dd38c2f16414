// What every evacuation store keeps, run against each: the embedded file store
// and the etcd store (against a real etcd this test starts on loopback; skipped
// with the reason when etcd is not installed). A reservation takes all its
// units or none and names who holds a unit it cannot have; a retried Reserve
// returns what it made; processes racing for the last free unit get it exactly
// once (the etcd case: controllers on several machines); lines appended by
// several processes form one unbroken sequence.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "engine/evacuation/etcd_client.h"
#include "gpumigrate/evacuation/evacuation_store.h"

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// One etcd for the whole suite, on loopback ports nobody else uses.
struct Etcd {
  pid_t pid = -1;
  std::string dir, endpoint, why_not;

  void Start() {
    if (std::system("command -v etcd >/dev/null 2>&1") != 0) {
      why_not = "etcd is not installed (scripts/bootstrap installs etcd-server)";
      return;
    }
    char tmpl[] = "/tmp/gm-etcd-XXXXXX";
    dir = mkdtemp(tmpl);
    for (int attempt = 0; attempt < 3 && pid < 0; ++attempt) {
      const int client = FreePort(), peer = FreePort();
      endpoint = "http://127.0.0.1:" + std::to_string(client);
      const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
      pid_t p = fork();
      if (p == 0) {
        const std::string log = dir + "/etcd.log";
        if (freopen(log.c_str(), "a", stdout) == nullptr || freopen(log.c_str(), "a", stderr) == nullptr) _exit(126);
        execlp("etcd", "etcd", "--data-dir", (dir + "/data").c_str(), "--listen-client-urls", endpoint.c_str(),
               "--advertise-client-urls", endpoint.c_str(), "--listen-peer-urls", peer_url.c_str(),
               "--initial-advertise-peer-urls", peer_url.c_str(), "--initial-cluster",
               ("default=" + peer_url).c_str(), nullptr);
        _exit(127);
      }
      // Ready when a store opens (etcd answers its gateway).
      for (int i = 0; i < 300; ++i) {
        if (OpenEtcdStore(endpoint, "/probe/").ok()) {
          pid = p;
          break;
        }
        int st = 0;
        if (waitpid(p, &st, WNOHANG) == p) break;  // a port taken meanwhile: try others
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (pid < 0) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
      }
    }
    if (pid < 0) why_not = "etcd did not start (see " + dir + "/etcd.log)";
  }

  void Stop() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      waitpid(pid, nullptr, 0);
    }
    if (!dir.empty() && why_not.empty()) fs::remove_all(dir);
  }
};

Etcd* etcd = nullptr;

class StoreContract : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    etcd = new Etcd;
    etcd->Start();
  }
  static void TearDownTestSuite() {
    etcd->Stop();
    delete etcd;
    etcd = nullptr;
  }

  void SetUp() override {
    if (GetParam() == "etcd") {
      if (!etcd->why_not.empty()) GTEST_SKIP() << etcd->why_not;
      // A prefix of its own per test: nothing one test wrote is seen by another.
      prefix_ = std::string("/t/") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
    } else {
      char tmpl[] = "/tmp/gm-store-XXXXXX";
      ASSERT_NE(mkdtemp(tmpl), nullptr);
      dir_ = tmpl;
    }
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  // What each process (the test or a child) opens.
  Result<std::unique_ptr<EvacuationStore>> OpenStore() {
    return GetParam() == "etcd" ? OpenEtcdStore(etcd->endpoint, prefix_) : OpenFileStore(dir_ + "/store");
  }
  std::unique_ptr<EvacuationStore> Open() {
    auto s = OpenStore();
    EXPECT_TRUE(s.ok()) << s.status().message();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // Children each run `work(store, child)`, exit 0 on success, 1 on a refusal;
  // returns how many succeeded (-1: a child failed otherwise).
  template <typename F>
  int InChildren(int children, F work) {
    std::vector<pid_t> pids;
    for (int c = 0; c < children; ++c) {
      pid_t pid = fork();
      if (pid == 0) {
        auto store = OpenStore();
        _exit(store.ok() ? work(**store, c) : 2);
      }
      pids.push_back(pid);
    }
    int ok = 0;
    bool broken = false;
    for (pid_t pid : pids) {
      int st = 0;
      waitpid(pid, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) > 1) broken = true;
      if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ++ok;
    }
    return broken ? -1 : ok;
  }

  std::string dir_, prefix_;
};

Reservation Want(const std::string& evacuation, const std::string& vm, std::vector<std::string> units) {
  return {.evacuation = evacuation, .vm = vm, .host = "gpu-b", .units = std::move(units)};
}

TEST_P(StoreContract, AReservationTakesAllItsUnitsOrNoneAndNamesTheHolder) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto a = store->Reserve(Want("e1", "llm-1", {"gpu-b/gpu0/slice0", "gpu-b/gpu0/slice1"}));
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->id, "r1");
  auto b = store->Reserve(Want("e2", "llm-2", {"gpu-b/gpu0/slice2", "gpu-b/gpu0/slice1"}));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(b.status().message().find("gpu-b/gpu0/slice1 is already reserved by evacuation e1 for llm-1 (r1)"),
            std::string::npos)
      << b.status().message();
  // None of it was taken: slice2 is still free.
  auto c = store->Reserve(Want("e2", "llm-2", {"gpu-b/gpu0/slice2"}));
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto all = store->Reservations();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].units, std::vector<std::string>{"gpu-b/gpu0/slice2"});
  // Another VM of the same evacuation does not get a unit twice either, and a
  // unit listed twice is refused before anything is asked.
  EXPECT_FALSE(store->Reserve(Want("e1", "llm-3", {"gpu-b/gpu0/slice0"})).ok());
  auto twice = store->Reserve(Want("e1", "llm-3", {"u9", "u9"}));
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("unit u9 is listed twice"), std::string::npos);
}

TEST_P(StoreContract, ARetriedReserveReturnsTheSameReservation) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto a = store->Reserve(Want("e1", "llm-1", {"gpu-b/gpu2"}));
  auto again = store->Reserve(Want("e1", "llm-1", {"gpu-b/gpu2"}));
  ASSERT_TRUE(a.ok() && again.ok());
  EXPECT_EQ(a->id, again->id);
  EXPECT_EQ(store->Reservations()->size(), 1u);
}

TEST_P(StoreContract, ARetryMayListTheUnitsInAnotherOrderButTooManyUnitsAreRefused) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto a = store->Reserve(Want("e1", "llm-1", {"u1", "u2", "u3"}));
  auto again = store->Reserve(Want("e1", "llm-1", {"u3", "u1", "u2"}));
  ASSERT_TRUE(a.ok() && again.ok()) << again.status().message();
  EXPECT_EQ(a->id, again->id);
  std::vector<std::string> many;
  for (int i = 0; i < 61; ++i) many.push_back("big/" + std::to_string(i));
  auto big = store->Reserve(Want("e1", "llm-2", many));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("at most 60"), std::string::npos) << big.status().message();
  many.pop_back();
  EXPECT_TRUE(store->Reserve(Want("e1", "llm-2", many)).ok()) << "60 fit in one etcd transaction";
}

TEST_P(StoreContract, AnEntryWithoutItsVmIsRefusedAndBytesThatAreNotUtf8AreKeptReadable) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto bad = store->Append({.evacuation = "e1", .phase = JournalPhase::kPlanned});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("names its evacuation and VM"), std::string::npos);
  auto e = store->Append({.evacuation = "e1", .vm = "llm-1", .phase = JournalPhase::kFailed,
                          .detail = std::string("device said \xff\xfe") + "!"});
  ASSERT_TRUE(e.ok()) << e.status().message();
  auto j = store->Journal("");
  ASSERT_TRUE(j.ok()) << j.status().message();
  ASSERT_EQ(j->size(), 1u);
  EXPECT_EQ((*j)[0].detail.rfind("device said ", 0), 0u);
  EXPECT_EQ((*j)[0].detail.back(), '!');
}

TEST_P(StoreContract, ReleasedUnitsAreFreeAndAnUnknownIdIsNamed) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  auto a = store->Reserve(Want("e1", "llm-1", {"u1"}));
  auto b = store->Reserve(Want("e1", "llm-2", {"u2"}));
  auto c = store->Reserve(Want("e2", "llm-3", {"u3"}));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(store->Release(a->id).ok());
  EXPECT_TRUE(store->Reserve(Want("e2", "llm-4", {"u1"})).ok());
  Status unknown = store->Release("r99");
  EXPECT_FALSE(unknown.ok());
  EXPECT_NE(unknown.message().find("no reservation r99"), std::string::npos) << unknown.message();
  auto n = store->ReleaseAll("e2");
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_EQ(*n, 2u);
  auto left = store->Reservations();
  ASSERT_EQ(left->size(), 1u);
  EXPECT_EQ((*left)[0].vm, "llm-2");
  EXPECT_TRUE(store->Reserve(Want("e3", "llm-5", {"u3"})).ok()) << "ReleaseAll freed u3";
}

TEST_P(StoreContract, ProcessesRacingForTheLastFreeSlotGetItExactlyOnce) {
  ASSERT_NE(Open(), nullptr);
  for (int round = 0; round < 15; ++round) {
    const std::string unit = "gpu-c/gpu0/slice" + std::to_string(round);
    const int winners = InChildren(6, [&](EvacuationStore& s, int c) {
      auto r = s.Reserve(Want("evac-" + std::to_string(c), "vm-" + std::to_string(c), {unit}));
      return r.ok() ? 0 : r.status().code() == StatusCode::kFailedPrecondition ? 1 : 2;
    });
    EXPECT_EQ(winners, 1) << "round " << round;
  }
  auto all = Open()->Reservations();
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_EQ(all->size(), 15u);
}

TEST_P(StoreContract, LinesAppendedByManyProcessesFormOneUnbrokenSequence) {
  ASSERT_NE(Open(), nullptr);
  const int ok = InChildren(4, [](EvacuationStore& s, int c) {
    for (int i = 0; i < 25; ++i) {
      JournalEntry e{.evacuation = "e1", .controller = "c" + std::to_string(c), .vm = "vm-" + std::to_string(c),
                     .action = "live-migrate", .phase = JournalPhase::kStarted};
      if (!s.Append(e).ok()) return 2;
    }
    return 0;
  });
  ASSERT_EQ(ok, 4);
  auto store = Open();
  ASSERT_TRUE(store->Append({.evacuation = "e2", .vm = "other", .phase = JournalPhase::kPlanned}).ok());
  auto j = store->Journal("");
  ASSERT_TRUE(j.ok()) << j.status().message();
  ASSERT_EQ(j->size(), 101u);
  for (size_t i = 0; i < j->size(); ++i) EXPECT_EQ((*j)[i].seq, i + 1);
  auto states = SummarizeJournal(*store->Journal("e1"));
  ASSERT_EQ(states.size(), 4u);
  for (const auto& s : states) {
    EXPECT_EQ(s.attempts, 25u) << s.vm;
    EXPECT_TRUE(s.unresolved()) << s.vm;
  }
}

TEST_P(StoreContract, OneStoreSharedByThreadsKeepsOneSequence) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&store, t] {
      for (int i = 0; i < 20; ++i) {
        ASSERT_TRUE(store->Append({.evacuation = "e1", .vm = "vm-" + std::to_string(t),
                                   .phase = JournalPhase::kStarted}).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  auto j = store->Journal("");
  ASSERT_TRUE(j.ok()) << j.status().message();
  ASSERT_EQ(j->size(), 60u);
  for (size_t i = 0; i < j->size(); ++i) EXPECT_EQ((*j)[i].seq, i + 1);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreContract, ::testing::Values(std::string("file"), std::string("etcd")),
                         [](const auto& p) { return std::string(p.param); });

// etcd alone: a unit key left without its reservation (a record removed by
// hand) is named with how to free it, never granted over; base64 both ways.
TEST(EtcdStore, AUnitKeyWithoutItsReservationIsNamedNotGrantedOver) {
  Etcd own;
  own.Start();
  if (!own.why_not.empty()) GTEST_SKIP() << own.why_not;
  evacuation::EtcdClient raw(own.endpoint);
  evacuation::EtcdClient::Txn put;
  put.Put("/orphan/units/gpu-d/gpu0", "r77");
  ASSERT_TRUE(raw.Commit(put).ok());
  auto store = OpenEtcdStore(own.endpoint, "/orphan/");
  ASSERT_TRUE(store.ok()) << store.status().message();
  auto r = (*store)->Reserve(Want("e1", "llm-1", {"gpu-d/gpu0"}));
  own.Stop();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("gpu-d/gpu0 is held by r77"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("delete the key /orphan/units/gpu-d/gpu0"), std::string::npos);
}

TEST(EtcdBase64, EveryLengthRoundTrips) {
  std::string s;
  for (int n = 0; n < 10; ++n) {
    auto back = evacuation::Unbase64(evacuation::Base64(s));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s) << n << " bytes";
    s.push_back(static_cast<char>(0xf0 + n));
  }
  EXPECT_EQ(evacuation::Base64("ab"), "YWI=");
  EXPECT_FALSE(evacuation::Unbase64("YWI").ok());
}

}  // namespace
}  // namespace gpumigrate
