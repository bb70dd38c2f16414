// The embedded evacuation store: a directory on one machine. Every call takes
// an flock on DIR/lock for its whole read-check-write, so evacuations in
// several processes of this machine see each other's reservations and journal
// lines. Each record is a line "<xxh64 hex> <json>": the checksum covers the
// exact JSON bytes, so damage is found without trusting the JSON to re-encode
// the same way.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <xxhash.h>

#include "engine/evacuation/records.h"
#include "gpumigrate/evacuation/evacuation_store.h"

namespace gpumigrate {

namespace {

using evacuation::J;
using evacuation::NowUnixMs;

constexpr auto kLockWait = std::chrono::seconds(10);

std::string Line(const J& j) {
  const std::string text = evacuation::Dump(j);
  return fmt::format("{:016x} {}\n", XXH64(text.data(), text.size(), 0), text);
}

// The JSON of one "<hex> <json>" line, or why not.
Result<J> ParseLine(const std::string& line, const std::string& where) {
  if (line.size() < 18 || line[16] != ' ') return Corrupt(fmt::format("{}: not a checksummed record", where));
  const std::string text = line.substr(17);
  if (fmt::format("{:016x}", XXH64(text.data(), text.size(), 0)) != line.substr(0, 16)) {
    return Corrupt(fmt::format("{}: checksum mismatch (the record was damaged)", where));
  }
  J j = J::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Corrupt(fmt::format("{}: not a JSON object", where));
  return j;
}

Result<std::string> ReadAll(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::string();
    return Status::FromErrno(errno, "open " + path);
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Status s = Status::FromErrno(errno, "read " + path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

Status WriteFully(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "write " + path);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status SyncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + dir);
  int rc = fsync(fd);
  close(fd);
  return rc == 0 ? Status::Ok() : Status::FromErrno(errno, "fsync " + dir);
}

struct ReservationTable {
  uint64_t next_id = 1;
  std::vector<Reservation> reservations;
};

class FileStore final : public EvacuationStore {
 public:
  explicit FileStore(std::string dir)
      : dir_(std::move(dir)), journal_(dir_ + "/journal.jsonl"), table_(dir_ + "/reservations.json") {}

  Status Init() {
    if (mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno(errno, "mkdir " + dir_);
    lock_fd_ = open((dir_ + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock_fd_ < 0) return Status::FromErrno(errno, "open " + dir_ + "/lock");
    GM_ASSIGN_OR_RETURN(Lock lock, TakeLock());
    GM_RETURN_IF_ERROR(RepairTornTail());
    // Read both once: a damaged store is refused at open, not mid-evacuation.
    GM_RETURN_IF_ERROR(ReadJournal().status());
    return ReadTable().status();
  }

  ~FileStore() override {
    if (lock_fd_ >= 0) close(lock_fd_);
  }

  std::string Describe() const override { return "file store " + dir_; }
  std::vector<std::string> Notes() const override {
    std::lock_guard<std::mutex> held(mu_);
    return notes_;
  }

  Result<Reservation> Reserve(Reservation r) override {
    GM_RETURN_IF_ERROR(evacuation::CheckReservation(r));
    GM_ASSIGN_OR_RETURN(Lock lock, TakeLock());
    GM_ASSIGN_OR_RETURN(ReservationTable t, ReadTable());
    for (const auto& held : t.reservations) {
      // A retried Reserve (the controller restarted before it saw the answer)
      // returns the reservation it made.
      if (evacuation::SameReservation(held, r)) return held;
    }
    for (const auto& held : t.reservations) {
      if (std::string u = evacuation::FirstShared(held, r); !u.empty()) return evacuation::Conflict(u, held);
    }
    r.id = fmt::format("r{}", t.next_id++);
    if (r.created_unix_ms == 0) r.created_unix_ms = NowUnixMs();
    t.reservations.push_back(r);
    GM_RETURN_IF_ERROR(WriteTable(t));
    return r;
  }

  Status Release(const std::string& id) override {
    GM_ASSIGN_OR_RETURN(Lock lock, TakeLock());
    GM_ASSIGN_OR_RETURN(ReservationTable t, ReadTable());
    auto it = std::find_if(t.reservations.begin(), t.reservations.end(),
                           [&](const Reservation& x) { return x.id == id; });
    if (it == t.reservations.end()) return InvalidArgument(fmt::format("no reservation {} in {}", id, table_));
    t.reservations.erase(it);
    return WriteTable(t);
  }

  Result<size_t> ReleaseAll(const std::string& evacuation) override {
    GM_ASSIGN_OR_RETURN(Lock lock, TakeLock());
    GM_ASSIGN_OR_RETURN(ReservationTable t, ReadTable());
    const size_t before = t.reservations.size();
    std::erase_if(t.reservations, [&](const Reservation& x) { return x.evacuation == evacuation; });
    const size_t n = before - t.reservations.size();
    if (n > 0) GM_RETURN_IF_ERROR(WriteTable(t));
    return n;
  }

  Result<std::vector<Reservation>> Reservations() override {
    GM_ASSIGN_OR_RETURN(Lock lock, TakeLock());
    GM_ASSIGN_OR_RETURN(ReservationTable t, ReadTable());
    return t.reservations;
  }

  Result<JournalEntry> Append(JournalEntry e) override {
    GM_RETURN_IF_ERROR(evacuation::CheckEntry(e));
    GM_ASSIGN_OR_RETURN(Lock lock, TakeLock());
    GM_RETURN_IF_ERROR(RepairTornTail());
    GM_ASSIGN_OR_RETURN(std::vector<JournalEntry> all, ReadJournal());
    e.seq = all.empty() ? 1 : all.back().seq + 1;
    if (e.unix_ms == 0) e.unix_ms = NowUnixMs();
    struct stat st{};
    const bool fresh = stat(journal_.c_str(), &st) != 0;
    int fd = open(journal_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return Status::FromErrno(errno, "open " + journal_);
    Status s = WriteFully(fd, Line(evacuation::ToJson(e)), journal_);
    if (s.ok() && fsync(fd) != 0) s = Status::FromErrno(errno, "fsync " + journal_);
    close(fd);
    if (s.ok() && fresh) s = SyncDir(dir_);
    if (!s.ok()) return s;
    return e;
  }

  Result<std::vector<JournalEntry>> Journal(const std::string& evacuation) override {
    GM_ASSIGN_OR_RETURN(Lock lock, TakeLock());
    GM_RETURN_IF_ERROR(RepairTornTail());
    GM_ASSIGN_OR_RETURN(std::vector<JournalEntry> all, ReadJournal());
    if (!evacuation.empty()) std::erase_if(all, [&](const JournalEntry& e) { return e.evacuation != evacuation; });
    return all;
  }

 private:
  // Held for one call. Across processes the flock excludes; inside one process
  // the mutex does (a second flock on the same descriptor would succeed).
  class Lock {
   public:
    Lock(int fd, std::unique_lock<std::mutex> held) : fd_(fd), held_(std::move(held)) {}
    Lock(Lock&& o) noexcept : fd_(std::exchange(o.fd_, -1)), held_(std::move(o.held_)) {}
    Lock& operator=(Lock&&) = delete;
    ~Lock() {
      if (fd_ >= 0) flock(fd_, LOCK_UN);
    }

   private:
    int fd_;
    std::unique_lock<std::mutex> held_;
  };

  Result<Lock> TakeLock() {
    std::unique_lock<std::mutex> held(mu_);
    const auto deadline = std::chrono::steady_clock::now() + kLockWait;
    while (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) return Status::FromErrno(errno, "flock " + dir_ + "/lock");
      if (std::chrono::steady_clock::now() > deadline) {
        return Status(StatusCode::kDeadlineExceeded,
                      fmt::format("{}/lock: held by another caller for {} s", dir_, kLockWait.count()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return Lock(lock_fd_, std::move(held));
  }

  // A crash mid-Append (in any process) leaves a last line without its
  // newline: that Append never returned, so the line is cut off (and said so
  // in Notes) before the journal is read or appended to.
  Status RepairTornTail() {
    GM_ASSIGN_OR_RETURN(std::string text, ReadAll(journal_));
    if (text.empty() || text.back() == '\n') return Status::Ok();
    const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    const size_t line = static_cast<size_t>(std::count(text.begin(), text.begin() + static_cast<long>(keep), '\n')) + 1;
    if (truncate(journal_.c_str(), static_cast<off_t>(keep)) != 0) return Status::FromErrno(errno, "truncate " + journal_);
    notes_.push_back(fmt::format("{} line {}: cut off by a crash mid-write ({} bytes, never acknowledged); removed",
                                 journal_, line, text.size() - keep));
    return Status::Ok();
  }

  Result<std::vector<JournalEntry>> ReadJournal() {
    GM_ASSIGN_OR_RETURN(std::string text, ReadAll(journal_));
    std::vector<JournalEntry> out;
    size_t pos = 0, line = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();  // RepairTornTail ran first: only a damaged last line
      ++line;
      const std::string where = fmt::format("{} line {}", journal_, line);
      GM_ASSIGN_OR_RETURN(J j, ParseLine(text.substr(pos, end - pos), where));
      GM_ASSIGN_OR_RETURN(JournalEntry e, evacuation::EntryFromJson(j, where));
      const uint64_t expected = out.empty() ? 1 : out.back().seq + 1;
      if (e.seq != expected) {
        return Corrupt(fmt::format("{}: seq {} where {} was due (a line is missing or repeated)", where, e.seq,
                                   expected));
      }
      out.push_back(std::move(e));
      pos = end + 1;
    }
    return out;
  }

  Result<ReservationTable> ReadTable() {
    GM_ASSIGN_OR_RETURN(std::string text, ReadAll(table_));
    ReservationTable t;
    if (text.empty()) return t;
    if (text.back() != '\n') return Corrupt(fmt::format("{}: truncated", table_));
    text.pop_back();
    GM_ASSIGN_OR_RETURN(J j, ParseLine(text, table_));
    if (!j.contains("next_id") || !j["next_id"].is_number_unsigned()) {
      return Corrupt(fmt::format("{}: no \"next_id\"", table_));
    }
    t.next_id = j["next_id"].get<uint64_t>();
    if (!j.contains("reservations") || !j["reservations"].is_array()) {
      return Corrupt(fmt::format("{}: no \"reservations\" list", table_));
    }
    size_t i = 0;
    for (const auto& x : j["reservations"]) {
      GM_ASSIGN_OR_RETURN(Reservation r, evacuation::ReservationFromJson(x, fmt::format("{} reservations[{}]", table_, i++)));
      t.reservations.push_back(std::move(r));
    }
    return t;
  }

  // Through a temporary file and a rename: a crash leaves the old table or the new.
  Status WriteTable(const ReservationTable& t) {
    J list = J::array();
    for (const auto& r : t.reservations) list.push_back(evacuation::ToJson(r));
    const J j = {{"version", 1}, {"next_id", t.next_id}, {"reservations", std::move(list)}};
    const std::string tmp = table_ + ".tmp";
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return Status::FromErrno(errno, "open " + tmp);
    Status s = WriteFully(fd, Line(j), tmp);
    if (s.ok() && fsync(fd) != 0) s = Status::FromErrno(errno, "fsync " + tmp);
    close(fd);
    if (s.ok() && rename(tmp.c_str(), table_.c_str()) != 0) s = Status::FromErrno(errno, "rename to " + table_);
    if (s.ok()) s = SyncDir(dir_);
    return s;
  }

  std::string dir_, journal_, table_;
  int lock_fd_ = -1;
  mutable std::mutex mu_;
  std::vector<std::string> notes_;
};

}  // namespace

Result<std::unique_ptr<EvacuationStore>> OpenFileStore(const std::string& dir) {
  if (dir.empty()) return InvalidArgument("the store's directory is empty");
  auto store = std::make_unique<FileStore>(dir);
  if (Status s = store->Init(); !s.ok()) return s.WithContext("evacuation store " + dir);
  return std::unique_ptr<EvacuationStore>(std::move(store));
}

}  // namespace gpumigrate
