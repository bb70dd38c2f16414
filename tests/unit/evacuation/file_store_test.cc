// The embedded evacuation store (engine/evacuation/file_store.cc) beyond the
// contract every store keeps (store_contract_test.cc): what it holds outlives
// the process; a line torn by a crash is cut off and said so, while damage
// anywhere else is refused with the file and line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gpumigrate/evacuation/evacuation_store.h"

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gm-store-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = std::string(tmpl) + "/store";  // the store creates it
  }
  void TearDown() override { fs::remove_all(fs::path(dir_).parent_path()); }

  std::unique_ptr<EvacuationStore> Open() {
    auto s = OpenFileStore(dir_);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string Read(const std::string& name) {
    std::ifstream f(dir_ + "/" + name);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream f(dir_ + "/" + name, std::ios::trunc);
    f << text;
  }
  static JournalEntry Entry(const std::string& vm, JournalPhase phase) {
    return {.evacuation = "e1", .controller = "test", .vm = vm, .action = "live-migrate", .phase = phase,
            .target = "gpu-b"};
  }

  std::string dir_;
};

Reservation Want(const std::string& evacuation, const std::string& vm, std::vector<std::string> units) {
  return {.evacuation = evacuation, .vm = vm, .host = "gpu-b", .units = std::move(units)};
}

TEST_F(FileStoreTest, ReservationsAndTheJournalOutliveTheProcess) {
  {
    auto store = Open();
    ASSERT_TRUE(store->Reserve(Want("e1", "llm-1", {"u1"})).ok());
    ASSERT_TRUE(store->Append(Entry("llm-1", JournalPhase::kPlanned)).ok());
    ASSERT_TRUE(store->Append(Entry("llm-1", JournalPhase::kStarted)).ok());
  }
  auto store = Open();
  auto r = store->Reservations();
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].units, std::vector<std::string>{"u1"});
  auto j = store->Journal();
  ASSERT_TRUE(j.ok()) << j.status().message();
  ASSERT_EQ(j->size(), 2u);
  EXPECT_EQ((*j)[1].seq, 2u);
  EXPECT_EQ((*j)[1].phase, JournalPhase::kStarted);
  EXPECT_EQ((*j)[1].target, "gpu-b");
  EXPECT_GT((*j)[1].unix_ms, 0);
  // The next id continues: an id is never handed out twice.
  auto next = store->Reserve(Want("e1", "llm-2", {"u2"}));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->id, "r2");
}

TEST_F(FileStoreTest, ALineTornByACrashIsCutOffAndSaidSo) {
  {
    auto store = Open();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->Append(Entry("llm-1", JournalPhase::kPlanned)).ok());
  }
  // What a crash mid-write leaves: the start of a fourth line, no newline.
  std::string text = Read("journal.jsonl");
  const std::string line3 = text.substr(text.rfind('\n', text.size() - 2) + 1);
  {
    std::ofstream f(dir_ + "/journal.jsonl", std::ios::app);
    f << line3.substr(0, 30);
  }
  auto store = Open();
  ASSERT_EQ(store->Notes().size(), 1u);
  EXPECT_NE(store->Notes()[0].find("journal.jsonl line 4: cut off by a crash mid-write (30 bytes"), std::string::npos)
      << store->Notes()[0];
  EXPECT_EQ(store->Journal()->size(), 3u);
  auto e = store->Append(Entry("llm-1", JournalPhase::kStarted));
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->seq, 4u);
  // The torn bytes are gone: the three lines as they were, then the new one.
  const std::string now = Read("journal.jsonl");
  EXPECT_EQ(now.substr(0, text.size()), text);
  EXPECT_EQ(std::count(now.begin(), now.end(), '\n'), 4);
  EXPECT_EQ(now.back(), '\n');
  EXPECT_EQ(Open()->Journal()->size(), 4u);
}

TEST_F(FileStoreTest, ADamagedLineIsRefusedNamingTheFileAndLine) {
  {
    auto store = Open();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->Append(Entry("llm-1", JournalPhase::kPlanned)).ok());
  }
  std::string text = Read("journal.jsonl");
  const size_t second = text.find('\n') + 1;
  const size_t at = text.find("llm-1", second);
  text[at] = 'L';  // a byte of line 2
  Write("journal.jsonl", text);
  auto store = OpenFileStore(dir_);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(store.status().message().find("journal.jsonl line 2: checksum mismatch"), std::string::npos)
      << store.status().message();
}

TEST_F(FileStoreTest, ALineMissingFromTheMiddleIsRefused) {
  {
    auto store = Open();
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->Append(Entry("llm-1", JournalPhase::kPlanned)).ok());
  }
  std::string text = Read("journal.jsonl");
  const size_t second = text.find('\n') + 1;
  text.erase(second, text.find('\n', second) + 1 - second);
  Write("journal.jsonl", text);
  auto store = OpenFileStore(dir_);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("line 2: seq 3 where 2 was due"), std::string::npos) << store.status().message();
}

TEST_F(FileStoreTest, AJournalThatLostItsFirstLineIsRefused) {
  {
    auto store = Open();
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(store->Append(Entry("llm-1", JournalPhase::kPlanned)).ok());
  }
  std::string text = Read("journal.jsonl");
  Write("journal.jsonl", text.substr(text.find('\n') + 1));
  auto store = OpenFileStore(dir_);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("line 1: seq 2 where 1 was due"), std::string::npos)
      << store.status().message();
}

TEST_F(FileStoreTest, ADamagedReservationsFileIsRefusedAndALeftoverTemporaryIsNot) {
  {
    auto store = Open();
    ASSERT_TRUE(store->Reserve(Want("e1", "llm-1", {"u1"})).ok());
  }
  Write("reservations.json.tmp", "half a table from a crash");
  EXPECT_EQ(Open()->Reservations()->size(), 1u);
  std::string text = Read("reservations.json");
  text[text.find("u1")] = 'v';
  Write("reservations.json", text);
  auto store = OpenFileStore(dir_);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("reservations.json: checksum mismatch"), std::string::npos)
      << store.status().message();
}

TEST(SummarizeJournal, EachVmEndsInItsLastPhaseAndAStartedOneIsUnresolved) {
  auto e = [](const std::string& vm, JournalPhase p, const std::string& target = "") {
    return JournalEntry{.vm = vm, .action = "live-migrate", .phase = p, .target = target};
  };
  auto s = SummarizeJournal({e("a", JournalPhase::kPlanned, "gpu-b"), e("b", JournalPhase::kPlanned, "gpu-c"),
                             e("a", JournalPhase::kStarted), e("b", JournalPhase::kStarted),
                             e("a", JournalPhase::kCompleted), e("b", JournalPhase::kFailed),
                             e("b", JournalPhase::kReplanned, "gpu-d"), e("b", JournalPhase::kStarted)});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].vm, "a");
  EXPECT_TRUE(s[0].finished());
  EXPECT_EQ(s[0].target, "gpu-b");
  EXPECT_EQ(s[1].vm, "b");
  EXPECT_TRUE(s[1].unresolved());
  EXPECT_EQ(s[1].attempts, 2u);
  EXPECT_EQ(s[1].target, "gpu-d");
  EXPECT_FALSE(s[1].may_start()) << "started again blindly";
  auto doubt = SummarizeJournal({e("c", JournalPhase::kStarted), e("c", JournalPhase::kInDoubt)});
  EXPECT_TRUE(doubt[0].needs_operator());
  EXPECT_FALSE(doubt[0].may_start());
  EXPECT_FALSE(doubt[0].unresolved());
  auto retry = SummarizeJournal({e("d", JournalPhase::kStarted), e("d", JournalPhase::kFailed)});
  EXPECT_TRUE(retry[0].may_start());
}

TEST(JournalPhase, NamesRoundTrip) {
  for (auto p : {JournalPhase::kPlanned, JournalPhase::kStarted, JournalPhase::kCompleted, JournalPhase::kFailed,
                 JournalPhase::kInDoubt, JournalPhase::kReplanned}) {
    EXPECT_EQ(ParseJournalPhase(JournalPhaseName(p)), p);
  }
  EXPECT_FALSE(ParseJournalPhase("done").has_value());
}

}  // namespace
}  // namespace gpumigrate
