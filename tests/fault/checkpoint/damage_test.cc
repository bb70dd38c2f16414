// Damaged and tampered checkpoint files, in LevelDB's manner: truncated at
// every record boundary and inside every record, a bit flipped in every field
// of the file header and of record headers, in payloads, tags and the footer,
// records swapped between two files of one device, old and future versions.
// Each is refused, naming where, and a restore writes nothing to the device.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "checkpoint.pb.h"
#include "engine/checkpoint/file_format.h"
#include "gpumigrate/checkpoint/checkpoint.h"
#include "gpumigrate/devices/sim.h"

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;
using Bytes = std::string;

constexpr const char* kSpec = "sim:size=2MiB,hot=256KiB,page=16KiB,step=2ms,layers=8";

struct RecordSpan {
  uint64_t offset, length;  // header and body
  ckpt::RecordKind kind;
};

Bytes ReadAll(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), {});
}
void WriteAll(const std::string& p, const Bytes& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}

// The records of a well-formed file, walked by their headers.
std::vector<RecordSpan> Records(const Bytes& f) {
  std::vector<RecordSpan> out;
  uint64_t pos = ckpt::kFileHeaderBytes;
  while (pos + ckpt::kRecordHeaderBytes <= f.size()) {
    auto h = ckpt::DecodeRecordHeader(std::span<const std::byte, ckpt::kRecordHeaderBytes>(
        reinterpret_cast<const std::byte*>(f.data() + pos), ckpt::kRecordHeaderBytes));
    EXPECT_TRUE(h.ok());
    if (!h.ok()) break;
    out.push_back({pos, ckpt::kRecordHeaderBytes + h->body_length, h->kind});
    pos += ckpt::kRecordHeaderBytes + h->body_length;
  }
  EXPECT_EQ(pos, f.size());
  return out;
}

class DamageTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / fmt::format("gm-damage-{}", getpid()));
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    auto spec = ParseSimSpec(kSpec);
    ASSERT_TRUE(spec.ok());
    for (const char* name : {"a.ckpt", "b.ckpt"}) {
      auto src = SimDevice::Create(*spec, SimRole::kSource);
      ASSERT_TRUE(src.ok());
      CheckpointOptions o;
      o.session.max_frame_payload_bytes = 64 << 10;  // many records
      o.session.bandwidth_limit_bytes_per_s = 50e6;
      o.session.downtime_target = std::chrono::milliseconds(5);
      CheckpointReport r = WriteCheckpoint(**src, (*dir_ / name).string(), o);
      ASSERT_EQ(r.migration.outcome, Outcome::kCompleted) << r.migration.status.ToString();
    }
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string Path(const std::string& n) { return (*dir_ / n).string(); }

  // The verdict on `bytes` written as a file: the error, or "" when accepted.
  static std::string Verify(const Bytes& bytes, const std::string& name = "x.ckpt") {
    WriteAll(Path(name), bytes);
    auto v = VerifyCheckpoint(Path(name), RestoreOptions{});
    return v.ok() ? "" : v.status().message();
  }

  static fs::path* dir_;
};
fs::path* DamageTest::dir_ = nullptr;

TEST_F(DamageTest, TheUndamagedFileVerifies) {
  EXPECT_EQ(Verify(ReadAll(Path("a.ckpt"))), "");
  auto recs = Records(ReadAll(Path("a.ckpt")));
  ASSERT_GT(recs.size(), 20u);
  EXPECT_EQ(recs.front().kind, ckpt::RecordKind::kManifest);
  EXPECT_EQ(recs.back().kind, ckpt::RecordKind::kFooter);
}

TEST_F(DamageTest, TruncatedAtEveryRecordBoundaryAndInsideEveryRecord) {
  const Bytes f = ReadAll(Path("a.ckpt"));
  std::vector<uint64_t> cuts = {0, 10, ckpt::kFileHeaderBytes};
  for (const auto& r : Records(f)) {
    cuts.push_back(r.offset);                              // at the boundary
    cuts.push_back(r.offset + ckpt::kRecordHeaderBytes / 2);  // inside its header
    cuts.push_back(r.offset + r.length / 2 + 1);            // inside its body
    cuts.push_back(r.offset + r.length - 1);                // its last byte missing
  }
  for (uint64_t cut : cuts) {
    std::string err = Verify(f.substr(0, cut));
    ASSERT_NE(err, "") << "truncated at " << cut << " was accepted";
    EXPECT_NE(err.find("x.ckpt"), std::string::npos) << err;
    EXPECT_NE(err.find("byte"), std::string::npos) << "names no place: " << err;
  }
}

TEST_F(DamageTest, AFlippedBitInTheFileHeaderIsRefused) {
  const Bytes f = ReadAll(Path("a.ckpt"));
  for (size_t i = 0; i < ckpt::kFileHeaderBytes; ++i) {
    Bytes d = f;
    d[i] = static_cast<char>(d[i] ^ 0x10);
    std::string err = Verify(d);
    ASSERT_NE(err, "") << "file header byte " << i;
    EXPECT_NE(err.find("byte 0"), std::string::npos) << err;
  }
}

TEST_F(DamageTest, AFlippedBitInEveryRecordHeaderFieldIsRefused) {
  const Bytes f = ReadAll(Path("a.ckpt"));
  auto recs = Records(f);
  // The manifest, a frame, a control record, an index record and the footer.
  std::vector<RecordSpan> pick = {recs[0], recs[1]};
  for (const auto& r : recs) {
    if (r.kind == ckpt::RecordKind::kControl || r.kind == ckpt::RecordKind::kIndex) pick.push_back(r);
  }
  pick.push_back(recs.back());
  for (const auto& r : pick) {
    for (size_t i = 0; i < ckpt::kRecordHeaderBytes; ++i) {
      Bytes d = f;
      d[r.offset + i] = static_cast<char>(d[r.offset + i] ^ 0x01);
      std::string err = Verify(d);
      ASSERT_NE(err, "") << ckpt::RecordKindName(r.kind) << " record at " << r.offset << ", header byte " << i;
      EXPECT_NE(err.find(fmt::format("at byte {}", r.offset)), std::string::npos) << err;
    }
  }
}

TEST_F(DamageTest, AFlippedBitInPayloadsTagsAndTheFooterIsRefused) {
  const Bytes f = ReadAll(Path("a.ckpt"));
  for (const auto& r : Records(f)) {
    const uint64_t body = r.offset + ckpt::kRecordHeaderBytes;
    // The frame header inside the body, the middle of the payload, the tag.
    for (uint64_t at : {body + 3, body + (r.length - ckpt::kRecordHeaderBytes) / 2, r.offset + r.length - 1}) {
      Bytes d = f;
      d[at] = static_cast<char>(d[at] ^ 0x80);
      std::string err = Verify(d);
      ASSERT_NE(err, "") << ckpt::RecordKindName(r.kind) << " record at " << r.offset << ", byte " << at;
      EXPECT_NE(err.find("byte"), std::string::npos) << err;
    }
  }
}

TEST_F(DamageTest, RecordsSwappedBetweenTwoFilesOfOneDeviceAreRefused) {
  const Bytes a = ReadAll(Path("a.ckpt")), b = ReadAll(Path("b.ckpt"));
  auto ra = Records(a), rb = Records(b);
  for (size_t i = 1; i < std::min(ra.size(), rb.size()); i += 3) {
    Bytes d = a.substr(0, ra[i].offset) + b.substr(rb[i].offset, rb[i].length) +
              a.substr(ra[i].offset + ra[i].length);
    if (d == a) continue;  // identical records (both all-zero frames, say) are no tamper
    std::string err = Verify(d);
    EXPECT_NE(err, "") << "record " << i << " of b.ckpt spliced into a.ckpt was accepted";
  }
}

TEST_F(DamageTest, ReorderedRecordsAreRefused) {
  const Bytes f = ReadAll(Path("a.ckpt"));
  auto recs = Records(f);
  const auto& x = recs[2];
  const auto& y = recs[3];
  Bytes d = f.substr(0, x.offset) + f.substr(y.offset, y.length) + f.substr(x.offset, x.length) +
            f.substr(y.offset + y.length);
  std::string err = Verify(d);
  ASSERT_NE(err, "");
  EXPECT_NE(err.find("record number"), std::string::npos) << err;
}

TEST_F(DamageTest, OldAndFutureVersionsAreRefusedByName) {
  const Bytes f = ReadAll(Path("a.ckpt"));
  auto h = ckpt::DecodeFileHeader(std::span<const std::byte, ckpt::kFileHeaderBytes>(
      reinterpret_cast<const std::byte*>(f.data()), ckpt::kFileHeaderBytes));
  ASSERT_TRUE(h.ok());
  for (auto [major, minor] : {std::pair<uint16_t, uint16_t>{0, 9}, {2, 0}, {1, 2}}) {
    ckpt::FileHeader v = *h;
    v.major = major;
    v.minor = minor;
    auto enc = ckpt::EncodeFileHeader(v);  // a well-formed header of that version
    Bytes d = Bytes(reinterpret_cast<const char*>(enc.data()), enc.size()) + f.substr(ckpt::kFileHeaderBytes);
    std::string err = Verify(d);
    ASSERT_NE(err, "") << major << "." << minor;
    EXPECT_NE(err.find(fmt::format("version {}.{}", major, minor)), std::string::npos) << err;
  }
}

TEST_F(DamageTest, ARefusedFileWritesNothingToTheDevice) {
  const Bytes f = ReadAll(Path("a.ckpt"));
  auto recs = Records(f);
  auto spec = ParseSimSpec(kSpec);
  ASSERT_TRUE(spec.ok());
  // Damage near the end: a naive restore would have applied most of the file first.
  for (uint64_t at : {recs[recs.size() - 3].offset + ckpt::kRecordHeaderBytes + 60, f.size() - 2}) {
    Bytes d = f;
    d[at] = static_cast<char>(d[at] ^ 0x04);
    WriteAll(Path("dev.ckpt"), d);
    auto dst = SimDevice::Create(*spec, SimRole::kDestination);
    ASSERT_TRUE(dst.ok());
    MigrationReport r = RestoreCheckpoint(Path("dev.ckpt"), **dst, RestoreOptions{});
    EXPECT_NE(r.outcome, Outcome::kCompleted);
    EXPECT_NE(r.status.message().find("dev.ckpt"), std::string::npos) << r.status.ToString();
    EXPECT_EQ((*dst)->State(), DeviceState::kStop) << "the device never left STOP";
    for (const auto& reg : (*dst)->Regions()) {
      std::vector<std::byte> buf(reg.size_bytes);
      ASSERT_TRUE((*dst)->Read(reg.id, 0, buf).ok());
      EXPECT_EQ(std::count(buf.begin(), buf.end(), std::byte{0}), static_cast<long>(buf.size()))
          << "region " << reg.name << " was written";
    }
  }
}

}  // namespace
}  // namespace gpumigrate

namespace gpumigrate {
namespace {

// A forged manifest (a plain file's tags are keyed by ids in its own header, so
// anyone can write one) claiming a device of 2^50 bytes: verify must refuse it
// before sizing any per-page state by it.
TEST_F(DamageTest, AManifestClaimingAHugeDeviceIsRefusedBeforeAllocating) {
  ckpt::FileHeader h;
  h.file_id = 11;
  h.chain_id = 22;
  auto keys = ckpt::DeriveFileKeys(h, std::nullopt);
  ASSERT_TRUE(keys.ok());
  wire::v1::CheckpointManifest m;
  auto* s = m.mutable_session();
  s->set_session_id(22);
  s->set_data_streams(1);
  s->set_cipher(wire::v1::CIPHER_NONE_INTEGRITY_ONLY);
  s->set_max_frame_payload_bytes(1 << 20);
  auto* r = s->add_regions();
  r->set_id(0);
  r->set_name("huge");
  r->set_size_bytes(uint64_t{1} << 50);
  r->set_page_size(4096);
  r->set_hint(wire::v1::REGION_HINT_STATIC);
  std::string body = m.SerializeAsString();
  ckpt::RecordSealer sealer(keys->records);
  auto rec = sealer.Seal(ckpt::RecordKind::kManifest, 0, std::as_bytes(std::span(body.data(), body.size())));
  ASSERT_TRUE(rec.ok());
  auto hb = ckpt::EncodeFileHeader(h);
  Bytes file(reinterpret_cast<const char*>(hb.data()), hb.size());
  file.append(reinterpret_cast<const char*>(rec->data()), rec->size());
  std::string err = Verify(file, "huge.ckpt");
  ASSERT_NE(err, "");
  EXPECT_NE(err.find("claims"), std::string::npos) << err;
  EXPECT_NE(err.find("record 0 at byte 64"), std::string::npos) << err;
}

}  // namespace
}  // namespace gpumigrate
