// Checkpoint files: a migration whose destination is a file.
//
// WriteCheckpoint runs the source session (gpumigrate/session/session.h) exactly as a
// migration does, live by default: it pre-copies rounds into the file while the
// device runs and stops the device only for the final delta (its stun reported
// as for a migration). The far end of the session's streams is a recorder that
// answers the protocol and appends what arrives, as records, to FILE.partial;
// Prepared is answered only once the file is complete, fsync'd and renamed to
// FILE. Any failure before that removes the partial file, leaves an earlier FILE
// untouched and the source device RUNNING (the session's rollback).
//
// RestoreCheckpoint replays a file (and the chain of bases an incremental file
// names) into the destination session, which checks every frame, every digest
// and the device state exactly as for a migration; the whole chain is verified
// first against a device that stores nothing, so a damaged or tampered file is
// refused before one byte reaches the real device. The device runs only once
// every digest matched.
//
// Files may be encrypted at rest with a 32-byte key file (AES-256-GCM under keys
// derived per file and per chain with HKDF). The layout is
// engine/checkpoint/FORMAT.md.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpumigrate/devices/device.h"
#include "gpumigrate/session/report.h"
#include "gpumigrate/session/session.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

using FileKey = std::array<std::byte, 32>;

// Reads a key file: exactly 32 bytes (as `openssl rand 32 > K` writes).
Result<FileKey> ReadKeyFile(const std::string& path);

struct CheckpointOptions {
  // The session's rules (switchover, codec, max stun, progress, cancel). Its
  // stop_and_copy, fate, continuation, aes_key and before_prepare are set by
  // WriteCheckpoint from the fields below.
  SourceOptions session;
  bool stop_first = false;                    // stop-and-copy instead of live pre-copy
  SourceFate then = SourceFate::kResume;      // what becomes of the device afterwards
  std::optional<FileKey> key;                 // encrypt at rest
  std::string base;                           // incremental: the checkpoint this one builds on
  // A content store (gpumigrate/content/content_store.h) this host keeps: pre-copy
  // pages it holds are recorded as their SHA-256, not their bytes, and a
  // restore fills them from the same store (RestoreOptions::session.
  // content_store_dir). Empty: every page's bytes go in the file.
  std::string content_store;
};

struct CheckpointReport {
  MigrationReport migration;   // the session's report: outcome, rounds, stun
  std::string path;
  uint64_t file_bytes = 0;
  uint64_t records = 0;
  bool encrypted = false;
  std::string base;            // the base's path, when incremental
  uint32_t chain_depth = 0;    // 0: a full checkpoint; n: n bases below it
  std::string fate;            // what became of the source device
  std::string content_store;   // the store the file leaves pages to (migration.dedup_pages of them)
};

CheckpointReport WriteCheckpoint(Device& device, const std::string& path, const CheckpointOptions& options);

// What a file holds, read without a device.
struct CheckpointInfo {
  std::string path;
  uint16_t version_major = 0, version_minor = 0;
  bool encrypted = false;
  uint64_t file_id = 0;
  uint64_t file_bytes = 0;
  bool manifest_read = false;  // false: encrypted and no key given; the rest is empty
  std::string device;
  std::vector<RegionInfo> regions;
  uint64_t created_unix_ms = 0;
  bool live = false;
  std::string source_fate;
  std::string base;            // incremental: the base's path as recorded
  uint64_t base_file_id = 0;
  std::string content_store;   // the store its pages were left to (checkpoint --content-store), as recorded
  // Filled by VerifyCheckpoint only:
  bool verified = false;
  uint64_t records = 0, frames = 0;
  uint32_t final_round = 0;
  uint64_t device_state_bytes = 0;
  std::vector<std::string> chain;  // base first, this file last
};

// Reads the header and the manifest only.
Result<CheckpointInfo> ReadCheckpointInfo(const std::string& path, const std::optional<FileKey>& key);

struct RestoreOptions {
  DestinationOptions session;
  std::optional<FileKey> key;
  // Where to find the base of an incremental file; empty: the path it recorded.
  std::vector<std::string> base_paths;
  // Called as the files are read, about every 64 MiB and at the end of each
  // pass ("verify", then "restore"), with bytes read of all the chain's files.
  std::function<void(std::string_view pass, uint64_t done_bytes, uint64_t total_bytes)> on_progress;
};

// Checks everything a restore would (records, frames, digests, device state, the
// chain) without a device. Ok only when a restore would succeed.
Result<CheckpointInfo> VerifyCheckpoint(const std::string& path, const RestoreOptions& options);

// Restores onto `device` (a destination in STOP, of the file's geometry). On
// success the device is RUNNING; on failure nothing was written (the file was
// refused by the verification pass) or what was written is discarded (ERROR).
MigrationReport RestoreCheckpoint(const std::string& path, Device& device, const RestoreOptions& options);

// JSON for the CLI: one object, one line.
std::string CheckpointReportToJson(const CheckpointReport& r);
std::string CheckpointInfoToJson(const CheckpointInfo& info);

}  // namespace gpumigrate
