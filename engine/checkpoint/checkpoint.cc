// Checkpoint files: the session over a recorder (write) or a replayer (restore,
// verify). gpumigrate/checkpoint/checkpoint.h says what each call promises.
#include "gpumigrate/checkpoint/checkpoint.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/checkpoint/file_reader.h"
#include "engine/checkpoint/file_sink.h"
#include "engine/checkpoint/null_device.h"
#include "engine/checkpoint/recorder.h"
#include "engine/checkpoint/replayer.h"
#include "engine/session/content_fill.h"

namespace gpumigrate {

namespace v1 = wire::v1;
using ckpt::FileReader;

namespace {

constexpr size_t kMaxChainDepth = 64;
using Chain = std::vector<std::unique_ptr<FileReader>>;

uint64_t RandomId() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) | rd();
  return v;
}

std::vector<RegionInfo> RegionsOf(const v1::Manifest& m) {
  std::vector<RegionInfo> out;
  for (const auto& w : m.regions()) {
    RegionInfo r;
    r.id = w.id();
    r.name = w.name();
    r.size_bytes = w.size_bytes();
    r.page_size = w.page_size();
    r.hint = static_cast<RegionHint>(w.hint());
    out.push_back(r);
  }
  return out;
}

// Ok when `b` has the same regions (id, size, page size) as `a`.
Status SameGeometry(const std::vector<RegionInfo>& a, const std::vector<RegionInfo>& b, std::string_view what) {
  if (a.size() != b.size()) return InvalidArgument(fmt::format("{}: {} regions against {}", what, a.size(), b.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].id != b[i].id || a[i].size_bytes != b[i].size_bytes || a[i].page_size != b[i].page_size) {
      return InvalidArgument(fmt::format("{}: region {} is {} bytes in {}-byte pages against {} bytes in {}-byte pages",
                                         what, a[i].name, a[i].size_bytes, a[i].page_size, b[i].size_bytes,
                                         b[i].page_size));
    }
  }
  return Status::Ok();
}

// The file and the bases it names, root first, each opened and linked.
Result<Chain> OpenChain(const std::string& path, const std::optional<FileKey>& key,
                        const std::vector<std::string>& base_paths) {
  Chain chain;
  GM_ASSIGN_OR_RETURN(auto top, FileReader::Open(path, key));
  chain.push_back(std::move(top));
  while (chain.back()->manifest().has_base()) {
    const FileReader& child = *chain.back();
    const auto& base = child.manifest().base();
    if (chain.size() > kMaxChainDepth) return Corrupt(fmt::format("{}: a chain deeper than {} files", path, kMaxChainDepth));
    const size_t k = chain.size() - 1;
    const std::string where = k < base_paths.size() ? base_paths[k] : base.path();
    auto opened = FileReader::Open(where, key);
    if (!opened.ok()) {
      return Status(opened.status().code(),
                    fmt::format("{} is incremental: its base {} cannot be read: {}", child.path(), where,
                                opened.status().message()));
    }
    if ((*opened)->header().file_id != base.file_id()) {
      return InvalidArgument(fmt::format("{} is incremental over file {:016x}, but {} is file {:016x} (a different "
                                         "checkpoint)", child.path(), base.file_id(), where,
                                         (*opened)->header().file_id));
    }
    if ((*opened)->header().chain_id != child.header().chain_id) {
      return Corrupt(fmt::format("{} and its base {} belong to different chains", child.path(), where));
    }
    chain.push_back(std::move(*opened));
  }
  std::reverse(chain.begin(), chain.end());
  const auto root = RegionsOf(chain[0]->manifest().session());
  for (size_t i = 1; i < chain.size(); ++i) {
    GM_RETURN_IF_ERROR(SameGeometry(root, RegionsOf(chain[i]->manifest().session()),
                                    fmt::format("{} against its base", chain[i]->path())));
    if (chain[i]->manifest().session().data_streams() != chain[0]->manifest().session().data_streams()) {
      return Corrupt(fmt::format("{} uses a different stream count than its base", chain[i]->path()));
    }
  }
  return chain;
}

struct Replayed {
  MigrationReport report;
  v1::CheckpointFooter footer;
  std::vector<std::vector<uint64_t>> page_hashes;
  bool ok() const { return report.outcome == Outcome::kCompleted; }
};

// Replays `chain` into `dev` through the destination session.
Replayed Replay(Chain& chain, Device& dev, const DestinationOptions& options, ckpt::Replayer::ProgressFn progress) {
  Replayed out;
  const v1::Manifest& m = chain[0]->manifest().session();
  auto [ctl_src, ctl_dst] = MakePipe("checkpoint control");
  std::vector<std::unique_ptr<Stream>> src_data, dst_data;
  SessionStreams src{ctl_src.get(), {}}, dst{ctl_dst.get(), {}};
  for (uint32_t s = 0; s < m.data_streams(); ++s) {
    auto [a, b] = MakePipe(fmt::format("checkpoint data {}", s));
    src.data.push_back(a.get());
    dst.data.push_back(b.get());
    src_data.push_back(std::move(a));
    dst_data.push_back(std::move(b));
  }
  ckpt::Replayer replayer(&chain, src, std::move(progress));
  replayer.Start();
  DestinationOptions o = options;
  o.aes_key.reset();
  if (chain[0]->keys().frames.aes_gcm) o.aes_key = chain[0]->keys().frames.aes_key;
  out.report = RunDestination(dev, dst, o);
  ctl_src->Close();
  for (auto& s : src_data) s->Close();
  Status rs = replayer.Join();
  // A fault the replayer found in the file: its words, not the session's echo.
  // A replayer that only saw the destination abort or close its streams echoes
  // the destination, whose reason is the one to report.
  const bool replayer_found = !rs.ok() && rs.code() != StatusCode::kAborted && rs.code() != StatusCode::kUnavailable;
  if (replayer_found && out.report.outcome != Outcome::kCompleted) {
    out.report.status = rs;
  } else if (!out.report.status.ok()) {
    // A frame the destination refused: say where in which file it lies.
    const std::string msg = out.report.status.message();
    size_t at = msg.find("data stream ");
    unsigned long long s = 0, seq = 0;
    if (at != std::string::npos && std::sscanf(msg.c_str() + at, "data stream %llu, frame %llu", &s, &seq) == 2) {
      std::string where = replayer.FrameWhere(s, seq);
      if (!where.empty()) out.report.status = Status(out.report.status.code(), fmt::format("{} ({})", msg, where));
    }
  }
  out.footer = replayer.footer();
  out.page_hashes = replayer.page_hashes();
  return out;
}

void FillInfo(const FileReader& f, CheckpointInfo& info) {
  info.path = f.path();
  info.version_major = f.header().major;
  info.version_minor = f.header().minor;
  info.encrypted = f.header().encrypted();
  info.file_id = f.header().file_id;
  info.file_bytes = f.file_bytes();
}

void FillManifest(const FileReader& f, CheckpointInfo& info) {
  const auto& m = f.manifest();
  info.manifest_read = true;
  info.device = m.session().device();
  info.regions = RegionsOf(m.session());
  info.created_unix_ms = m.created_unix_ms();
  info.live = m.live();
  info.source_fate = m.source_fate();
  info.content_store = m.content_store();
  if (m.has_base()) {
    info.base = m.base().path();
    info.base_file_id = m.base().file_id();
  }
}

struct VerifiedChain {
  CheckpointInfo info;
  v1::CheckpointFooter footer;
  std::vector<std::vector<uint64_t>> page_hashes;
  uint64_t chain_id = 0;
  uint32_t depth = 0;
};

Result<VerifiedChain> VerifyChain(const std::string& path, const RestoreOptions& options) {
  GM_ASSIGN_OR_RETURN(Chain chain, OpenChain(path, options.key, options.base_paths));
  VerifiedChain v;
  FillInfo(*chain.back(), v.info);
  FillManifest(*chain.back(), v.info);
  for (const auto& f : chain) v.info.chain.push_back(f->path());
  v.chain_id = chain.back()->header().chain_id;
  v.depth = static_cast<uint32_t>(chain.size() - 1);
  ckpt::NullDevice null(chain[0]->manifest().session().device(), RegionsOf(chain[0]->manifest().session()));
  ckpt::Replayer::ProgressFn progress;
  if (options.on_progress) progress = [&](uint64_t d, uint64_t t) { options.on_progress("verify", d, t); };
  Replayed r = Replay(chain, null, options.session, progress);
  if (!r.ok()) return r.report.status.ok() ? Corrupt(fmt::format("{}: refused", path)) : r.report.status;
  v.info.verified = true;
  v.info.records = r.footer.records() + 1;
  v.info.frames = r.footer.frames();
  v.info.final_round = r.footer.final_round();
  v.info.device_state_bytes = r.footer.device_state_bytes();
  v.footer = std::move(r.footer);
  v.page_hashes = std::move(r.page_hashes);
  return v;
}

}  // namespace

Result<FileKey> ReadKeyFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(fmt::format("key file {}: cannot open", path));
  FileKey key;
  in.read(reinterpret_cast<char*>(key.data()), key.size());
  const auto got = in.gcount();
  char extra;
  if (static_cast<size_t>(got) != key.size() || in.read(&extra, 1)) {
    return InvalidArgument(fmt::format("key file {}: must hold exactly 32 bytes (make one with `openssl rand 32 > {}`)",
                                       path, path));
  }
  return key;
}

namespace {

// An incremental checkpoint: the session continues from the base chain's last
// round, skipping pages whose hash the base already holds.
Status ContinueFromBase(const Device& device, const CheckpointOptions& options, ckpt::FileHeader& fh,
                        v1::CheckpointManifest& manifest, SourceOptions& so, CheckpointReport& rep) {
  RestoreOptions ro;
  ro.key = options.key;
  ro.session.content_store_dir = options.content_store;  // a base that left pages to it is verified with it
  auto base = VerifyChain(options.base, ro);
  if (!base.ok()) return base.status().WithContext(fmt::format("base checkpoint {}", options.base));
  GM_RETURN_IF_ERROR(SameGeometry(base->info.regions, device.Regions(), "the device against the base checkpoint"));
  fh.chain_id = base->chain_id;
  SessionContinuation c;
  c.first_round = base->footer.final_round() + 1;
  c.frames_per_stream.assign(base->footer.frames_per_stream().begin(), base->footer.frames_per_stream().end());
  c.page_hashes = std::move(base->page_hashes);
  so.continuation = std::move(c);
  auto* b = manifest.mutable_base();
  b->set_file_id(base->info.file_id);
  b->set_path(std::filesystem::absolute(options.base).string());
  *b->mutable_digests() = base->footer.digests();
  b->set_depth(base->depth + 1);
  rep.base = options.base;
  rep.chain_depth = base->depth + 1;
  return Status::Ok();
}

// The session speaks of a destination; here the destination is the file.
void SayTheFileFailed(CheckpointReport& rep, const std::string& path) {
  std::string msg = rep.migration.status.message();
  const std::string peer = "destination aborted in phase checkpoint write: ";
  if (auto at = msg.find(peer); at != std::string::npos) msg.replace(at, peer.size(), "the file could not be written: ");
  rep.migration.status = Status(rep.migration.status.code(), msg);
  if (rep.migration.resolution.rfind("the source is RUNNING", 0) == 0) {
    rep.migration.resolution =
        fmt::format("the source is RUNNING with its memory intact; the partial file was removed{}",
                    std::filesystem::exists(path) ? " and the earlier " + path + " is untouched" : "");
  }
}

// The file's keys: with a key, the header says the file is encrypted and carries
// the key's check, which a reader tests before it trusts the key.
Result<ckpt::FileKeys> FileKeysFor(const CheckpointOptions& options, ckpt::FileHeader& fh) {
  if (options.key) {
    fh.flags |= ckpt::kFlagEncrypted;
    auto check = ckpt::KeyCheck(*options.key, fh.file_id);
    if (!check.ok()) return check.status();
    fh.key_check = *check;
  }
  return ckpt::DeriveFileKeys(fh, options.key);
}

// What the manifest says of how the checkpoint was taken.
void StampManifest(v1::CheckpointManifest& manifest, const CheckpointOptions& options, const std::string& fate) {
  manifest.set_created_unix_ms(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch()).count()));
  manifest.set_source_fate(fate);
  manifest.set_live(!options.stop_first);
  manifest.set_product_version(GPUMIGRATE_VERSION);
}

// The content store the checkpoint offers pages from (none: `content` stays
// empty); the file's minor version says whether a reader needs one.
Status OpenContentStore(Device& device, const CheckpointOptions& options, ckpt::FileHeader& fh,
                        v1::CheckpointManifest& manifest, CheckpointReport& rep,
                        std::unique_ptr<ContentFill>& content) {
  if (!options.content_store.empty()) {
    if (options.stop_first) {
      return InvalidArgument("--content-store: a stop-and-copy checkpoint sends only a final round, which never "
                             "offers pages by digest; take it live");
    }
    auto opened = ContentFill::Open(options.content_store, device.Regions(), {});
    if (!opened.ok()) return opened.status().WithContext(fmt::format("content store {}", options.content_store));
    content = std::move(*opened);
    manifest.set_content_store(std::filesystem::absolute(options.content_store).string());
    rep.content_store = options.content_store;
    fh.minor = 1;  // readers before 1.1 would not know the file needs a store
  } else {
    fh.minor = 0;  // what every reader of major 1 reads
  }
  return Status::Ok();
}

}  // namespace

CheckpointReport WriteCheckpoint(Device& device, const std::string& path, const CheckpointOptions& options) {
  CheckpointReport rep;
  rep.path = path;
  rep.encrypted = options.key.has_value();
  rep.fate = std::string(SourceFateName(options.then));
  auto fail = [&](Status st) {
    rep.migration.status = std::move(st);
    rep.migration.device = device.Describe();
    rep.migration.resolution = "nothing was written; the device was not touched";
    return rep;
  };
  SourceOptions so = options.session;
  so.stop_and_copy = options.stop_first;
  so.fate = options.then;

  ckpt::FileHeader fh;
  fh.file_id = RandomId();
  fh.chain_id = RandomId();
  v1::CheckpointManifest manifest;
  if (!options.base.empty()) {
    if (Status st = ContinueFromBase(device, options, fh, manifest, so, rep); !st.ok()) return fail(st);
  }
  auto keys = FileKeysFor(options, fh);
  if (!keys.ok()) return fail(keys.status());
  so.session_id = fh.chain_id;
  so.aes_key.reset();
  if (keys->frames.aes_gcm) so.aes_key = keys->frames.aes_key;
  StampManifest(manifest, options, rep.fate);
  std::unique_ptr<ContentFill> content;
  if (Status st = OpenContentStore(device, options, fh, manifest, rep, content); !st.ok()) return fail(st);

  ckpt::FileSink sink(path);
  if (Status st = sink.Open(); !st.ok()) return fail(st);
  std::vector<std::vector<uint64_t>> hashes;
  auto prev = so.before_prepare;
  so.before_prepare = [&hashes, prev](const std::vector<std::vector<uint64_t>>& h) {
    if (prev) GM_RETURN_IF_ERROR(prev(h));
    hashes = h;
    return Status::Ok();
  };
  auto [ctl_src, ctl_file] = MakePipe("checkpoint control");
  auto [data_src, data_file] = MakePipe("checkpoint data 0");
  std::vector<uint64_t> first_frames;
  if (so.continuation) first_frames = so.continuation->frames_per_stream;
  if (!first_frames.empty() && first_frames.size() != 1) {
    return fail(Corrupt(fmt::format("base checkpoint {}: {} data streams, checkpoints write 1", options.base,
                                    first_frames.size())));
  }
  ckpt::Recorder recorder(&sink, fh, *keys, manifest, SessionStreams{ctl_file.get(), {data_file.get()}}, &hashes,
                          first_frames, content.get());
  recorder.Start();
  rep.migration = RunSource(device, SessionStreams{ctl_src.get(), {data_src.get()}}, so);
  ctl_src->Close();
  data_src->Close();
  Status rs = recorder.Join();
  rep.records = recorder.records();
  if (rep.migration.outcome == Outcome::kCompleted) {
    std::error_code ec;
    rep.file_bytes = std::filesystem::file_size(path, ec);
  } else if (rep.migration.status.ok() && !rs.ok()) {
    rep.migration.status = rs;
  }
  if (rep.migration.outcome == Outcome::kAborted && !rep.migration.dry_run) SayTheFileFailed(rep, path);
  return rep;
}

Result<CheckpointInfo> ReadCheckpointInfo(const std::string& path, const std::optional<FileKey>& key) {
  CheckpointInfo info;
  GM_ASSIGN_OR_RETURN(auto head, FileReader::Open(path, std::nullopt, true));
  FillInfo(*head, info);
  if (head->header().encrypted() && !key) return info;  // the manifest is sealed: say so, no more
  GM_ASSIGN_OR_RETURN(auto f, FileReader::Open(path, key));
  FillManifest(*f, info);
  return info;
}

Result<CheckpointInfo> VerifyCheckpoint(const std::string& path, const RestoreOptions& options) {
  GM_ASSIGN_OR_RETURN(VerifiedChain v, VerifyChain(path, options));
  return v.info;
}

MigrationReport RestoreCheckpoint(const std::string& path, Device& device, const RestoreOptions& options) {
  MigrationReport rep;
  rep.device = device.Describe();
  auto refuse = [&](Status st, std::string resolution) {
    rep.status = std::move(st);
    rep.resolution = std::move(resolution);
    return rep;
  };
  // The whole chain first, into nothing: a damaged file never reaches the device.
  auto head = OpenChain(path, options.key, options.base_paths);
  if (!head.ok()) return refuse(head.status(), "nothing was written to the device");
  if (Status st = SameGeometry(RegionsOf((*head)[0]->manifest().session()), device.Regions(),
                               "the checkpoint against the device");
      !st.ok()) {
    return refuse(st, "nothing was written to the device");
  }
  head->clear();
  auto verified = VerifyChain(path, options);
  if (!verified.ok()) return refuse(verified.status(), "the file was refused; nothing was written to the device");
  auto chain = OpenChain(path, options.key, options.base_paths);
  if (!chain.ok()) return refuse(chain.status(), "nothing was written to the device");
  ckpt::Replayer::ProgressFn progress;
  if (options.on_progress) progress = [&](uint64_t d, uint64_t t) { options.on_progress("restore", d, t); };
  Replayed r = Replay(*chain, device, options.session, progress);
  return r.report;
}

std::string CheckpointReportToJson(const CheckpointReport& r) {
  auto j = nlohmann::ordered_json::parse(ReportToJson(r.migration));
  nlohmann::ordered_json c;
  c["path"] = r.path;
  c["file_bytes"] = r.file_bytes;
  c["records"] = r.records;
  c["encrypted"] = r.encrypted;
  c["source_fate"] = r.fate;
  c["base"] = r.base.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(r.base);
  c["chain_depth"] = r.chain_depth;
  c["content_store"] = r.content_store.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(r.content_store);
  j["checkpoint"] = c;
  return j.dump();
}

std::string CheckpointInfoToJson(const CheckpointInfo& info) {
  nlohmann::ordered_json j;
  j["path"] = info.path;
  j["format_version"] = fmt::format("{}.{}", info.version_major, info.version_minor);
  j["encrypted"] = info.encrypted;
  j["file_id"] = fmt::format("{:016x}", info.file_id);
  j["file_bytes"] = info.file_bytes;
  j["manifest_read"] = info.manifest_read;
  if (info.manifest_read) {
    j["device"] = info.device;
    nlohmann::ordered_json regions = nlohmann::ordered_json::array();
    for (const auto& r : info.regions) {
      regions.push_back({{"id", r.id}, {"name", r.name}, {"size_bytes", r.size_bytes}, {"page_size", r.page_size},
                         {"hint", std::string(RegionHintName(r.hint))}});
    }
    j["regions"] = regions;
    j["created_unix_ms"] = info.created_unix_ms;
    j["live"] = info.live;
    j["source_fate"] = info.source_fate;
    j["base"] = info.base.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(info.base);
    if (!info.base.empty()) j["base_file_id"] = fmt::format("{:016x}", info.base_file_id);
    j["content_store"] = info.content_store.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(info.content_store);
  }
  if (info.verified) {
    j["verified"] = true;
    j["records"] = info.records;
    j["frames"] = info.frames;
    j["final_round"] = info.final_round;
    j["device_state_bytes"] = info.device_state_bytes;
    j["chain"] = info.chain;
  }
  return j.dump();
}

}  // namespace gpumigrate
