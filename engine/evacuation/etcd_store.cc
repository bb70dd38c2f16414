// The fleet's evacuation store: etcd, shared by controllers on several
// machines. Under PREFIX:
//   units/<unit>            the id of the reservation holding it
//   reservations/<n, 20 digits>  a reservation (JSON)
//   next_id                 the next reservation number
//   journal/<seq, 20 digits>     a journal entry (JSON)
//   journal_seq             the last entry's seq
// A reservation is one transaction: every unit key still absent and next_id
// unchanged since it was read, or nothing is written; a journal line likewise
// needs journal_seq unchanged. A lost race is read again: a unit someone else
// now holds is the refusal, naming them; a moved counter is simply retried.
#include <algorithm>
#include <charconv>
#include <random>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>

#include "engine/evacuation/etcd_client.h"
#include "engine/evacuation/records.h"
#include "gpumigrate/evacuation/evacuation_store.h"

namespace gpumigrate {

namespace {

using evacuation::EtcdClient;
using evacuation::J;
using evacuation::KeyValue;

constexpr int kAttempts = 100;

std::string Padded(uint64_t n) { return fmt::format("{:020}", n); }

class EtcdStore final : public EvacuationStore {
 public:
  EtcdStore(std::string endpoint, std::string prefix) : etcd_(std::move(endpoint)), prefix_(std::move(prefix)) {
    if (prefix_.empty() || prefix_.back() != '/') prefix_ += '/';
  }

  Status Check() {
    GM_RETURN_IF_ERROR(Journal("").status());
    return Reservations().status();
  }

  std::string Describe() const override { return fmt::format("etcd store {} under {}", etcd_.endpoint(), prefix_); }
  std::vector<std::string> Notes() const override { return {}; }

  Result<Reservation> Reserve(Reservation r) override {
    GM_RETURN_IF_ERROR(evacuation::CheckReservation(r));
    if (r.created_unix_ms == 0) r.created_unix_ms = evacuation::NowUnixMs();
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      GM_ASSIGN_OR_RETURN(std::vector<Reservation> held, Reservations());
      for (const auto& h : held) {
        if (evacuation::SameReservation(h, r)) return h;
      }
      for (const auto& h : held) {
        if (std::string u = evacuation::FirstShared(h, r); !u.empty()) return evacuation::Conflict(u, h);
      }
      GM_ASSIGN_OR_RETURN(Counter next, ReadCounter("next_id", 1));
      Reservation made = r;
      made.id = fmt::format("r{}", next.value);
      EtcdClient::Txn txn;
      txn.IfModRevision(prefix_ + "next_id", next.mod_revision);
      for (const auto& u : r.units) {
        txn.IfAbsent(prefix_ + "units/" + u);
        txn.Put(prefix_ + "units/" + u, made.id);
      }
      // The record's own key too: a counter removed by hand must not let a new
      // reservation overwrite an old one.
      txn.IfAbsent(prefix_ + "reservations/" + Padded(next.value));
      txn.Put(prefix_ + "reservations/" + Padded(next.value), evacuation::Dump(evacuation::ToJson(made)));
      txn.Put(prefix_ + "next_id", std::to_string(next.value + 1));
      GM_ASSIGN_OR_RETURN(bool done, etcd_.Commit(txn));
      if (done) return made;
      GM_RETURN_IF_ERROR(CheckOrphans(r));
      Backoff(attempt);
    }
    return Status(StatusCode::kDeadlineExceeded,
                  fmt::format("{}: reserving for {} lost {} races in a row", Describe(), r.vm, kAttempts));
  }

  Status Release(const std::string& id) override {
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      GM_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, etcd_.Get(prefix_ + "reservations/", true));
      const KeyValue* found = nullptr;
      Reservation r;
      for (const auto& kv : kvs) {
        GM_ASSIGN_OR_RETURN(Reservation x, Parse(kv));
        if (x.id == id) {
          found = &kv;
          r = std::move(x);
          break;
        }
      }
      if (found == nullptr) return InvalidArgument(fmt::format("no reservation {} in {}", id, Describe()));
      EtcdClient::Txn txn;
      txn.IfModRevision(found->key, found->mod_revision);
      txn.Delete(found->key);
      for (const auto& u : r.units) {
        // Only a unit key that still names this reservation is freed.
        GM_ASSIGN_OR_RETURN(std::vector<KeyValue> unit, etcd_.Get(prefix_ + "units/" + u));
        if (unit.empty() || unit[0].value != r.id) continue;
        txn.IfModRevision(unit[0].key, unit[0].mod_revision);
        txn.Delete(unit[0].key);
      }
      GM_ASSIGN_OR_RETURN(bool done, etcd_.Commit(txn));
      if (done) return Status::Ok();
      Backoff(attempt);
    }
    return Status(StatusCode::kDeadlineExceeded, fmt::format("{}: releasing {} lost every race", Describe(), id));
  }

  Result<size_t> ReleaseAll(const std::string& evacuation) override {
    GM_ASSIGN_OR_RETURN(std::vector<Reservation> held, Reservations());
    size_t n = 0;
    for (const auto& r : held) {
      if (r.evacuation != evacuation) continue;
      Status s = Release(r.id);
      if (s.code() == StatusCode::kInvalidArgument) continue;  // released by someone else meanwhile
      GM_RETURN_IF_ERROR(s);
      ++n;
    }
    return n;
  }

  Result<std::vector<Reservation>> Reservations() override {
    GM_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, etcd_.Get(prefix_ + "reservations/", true));
    std::vector<Reservation> out;
    for (const auto& kv : kvs) {
      GM_ASSIGN_OR_RETURN(Reservation r, Parse(kv));
      out.push_back(std::move(r));
    }
    return out;  // key order: the padded numbers, so the order they were made
  }

  Result<JournalEntry> Append(JournalEntry e) override {
    GM_RETURN_IF_ERROR(evacuation::CheckEntry(e));
    if (e.unix_ms == 0) e.unix_ms = evacuation::NowUnixMs();
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      GM_ASSIGN_OR_RETURN(Counter last, ReadCounter("journal_seq", 0));
      e.seq = last.value + 1;
      EtcdClient::Txn txn;
      txn.IfModRevision(prefix_ + "journal_seq", last.mod_revision);
      txn.IfAbsent(prefix_ + "journal/" + Padded(e.seq));
      txn.Put(prefix_ + "journal/" + Padded(e.seq), evacuation::Dump(evacuation::ToJson(e)));
      txn.Put(prefix_ + "journal_seq", std::to_string(e.seq));
      GM_ASSIGN_OR_RETURN(bool done, etcd_.Commit(txn));
      if (done) return e;
      Backoff(attempt);
    }
    return Status(StatusCode::kDeadlineExceeded, fmt::format("{}: appending lost {} races in a row", Describe(),
                                                             kAttempts));
  }

  Result<std::vector<JournalEntry>> Journal(const std::string& evacuation) override {
    GM_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, etcd_.Get(prefix_ + "journal/", true));
    std::vector<JournalEntry> out;
    uint64_t prev = 0;
    for (const auto& kv : kvs) {
      J j = J::parse(kv.value, nullptr, false);
      if (j.is_discarded() || !j.is_object()) return Corrupt(fmt::format("{} key {}: not a JSON object", Describe(), kv.key));
      GM_ASSIGN_OR_RETURN(JournalEntry e, evacuation::EntryFromJson(j, fmt::format("{} key {}", Describe(), kv.key)));
      if (e.seq != prev + 1) {
        return Corrupt(fmt::format("{} key {}: seq {} after {} (an entry is missing)", Describe(), kv.key, e.seq, prev));
      }
      prev = e.seq;
      if (evacuation.empty() || e.evacuation == evacuation) out.push_back(std::move(e));
    }
    return out;
  }

 private:
  struct Counter {
    uint64_t value = 0;
    int64_t mod_revision = 0;  // 0: absent
  };

  Result<Counter> ReadCounter(const std::string& name, uint64_t absent) {
    GM_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, etcd_.Get(prefix_ + name));
    if (kvs.empty()) return Counter{absent, 0};
    Counter c;
    const std::string& v = kvs[0].value;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), c.value);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
      return Corrupt(fmt::format("{} key {}: '{}' is not a number", Describe(), kvs[0].key, v));
    }
    c.mod_revision = kvs[0].mod_revision;
    return c;
  }

  Result<Reservation> Parse(const KeyValue& kv) {
    J j = J::parse(kv.value, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return Corrupt(fmt::format("{} key {}: not a JSON object", Describe(), kv.key));
    return evacuation::ReservationFromJson(j, fmt::format("{} key {}", Describe(), kv.key));
  }

  // A unit key whose reservation record is gone (removed by hand) would make
  // every transaction fail while no reservation conflicts: say so, and how to
  // free it, rather than retrying.
  Status CheckOrphans(const Reservation& r) {
    GM_ASSIGN_OR_RETURN(std::vector<Reservation> held, Reservations());
    for (const auto& u : r.units) {
      GM_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, etcd_.Get(prefix_ + "units/" + u));
      if (kvs.empty()) continue;
      const std::string& holder = kvs[0].value;
      if (std::none_of(held.begin(), held.end(), [&](const Reservation& h) { return h.id == holder; })) {
        return FailedPrecondition(fmt::format("{} is held by {} in {}, but no reservation {} exists (removed by "
                                              "hand?); delete the key {} to free it",
                                              u, holder, Describe(), holder, kvs[0].key));
      }
    }
    return Status::Ok();
  }

  // Controllers that lost a race spread out before they read again.
  static void Backoff(int attempt) {
    thread_local std::minstd_rand jitter(static_cast<unsigned>(getpid()) ^
                                         static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + jitter() % static_cast<unsigned>(4 + std::min(attempt, 20))));
  }

  EtcdClient etcd_;
  std::string prefix_;
};

}  // namespace

Result<std::unique_ptr<EvacuationStore>> OpenEtcdStore(const std::string& endpoint, const std::string& prefix) {
  if (endpoint.rfind("http://", 0) != 0) {
    return InvalidArgument(fmt::format("etcd endpoint '{}': expected http://HOST:PORT", endpoint));
  }
  auto store = std::make_unique<EtcdStore>(endpoint, prefix.empty() ? "/gpumigrate/" : prefix);
  if (Status s = store->Check(); !s.ok()) return s;
  return std::unique_ptr<EvacuationStore>(std::move(store));
}

}  // namespace gpumigrate
