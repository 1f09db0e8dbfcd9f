#pragma once

// Checkpoints on disk. DIR/step-N/ holds one shard per stage (stage-I.shard, the bytes of
// serialize_stage_state) and manifest.json, written last and atomically (temp file, fsync,
// rename, fsync of the directory): the manifest commits the checkpoint. DIR/latest names the
// newest committed step. A directory without a manifest that parses is never a checkpoint.
// Loading verifies the manifest, every shard's size and xxh3-64 checksum, and the job's config
// hash; a problem names the file.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "actors/storage/checkpoint_manifest.h"
#include "actors/storage/file_system.h"

namespace troupe::actors {

/// A committed checkpoint read back and verified.
struct loaded_checkpoint {
  std::string directory;  ///< DIR/step-N
  checkpoint_manifest manifest;
  std::vector<std::string> shards;  ///< each stage's shard bytes, in stage order
};

/// Reads DIRECTORY/manifest.json and every shard it lists, checking sizes and checksums, and,
/// when `config_hash` is not empty, that the manifest's hash equals it. Nothing, with `error`
/// naming the offending file, otherwise.
std::optional<loaded_checkpoint> load_checkpoint(const std::string& directory,
                                                 const std::string& config_hash,
                                                 std::string* error);

/// XXH3 64-bit of `bytes` as 16 lowercase hex digits.
std::string xxh3_hex(const void* data, size_t bytes);

class checkpoint_store {
 public:
  /// `root` is DIR (created on the first commit); keep at most `keep_last` committed
  /// checkpoints (0: keep all). Commits write through `files`, which must outlive the store.
  checkpoint_store(std::string root, int keep_last, file_system& files = posix_files());

  const std::string& root() const { return root_; }

  /// Writes DIR/step-N (N = manifest.step) with `shards[i]` as stage i's shard, fills the
  /// manifest's shard entries, commits it, points DIR/latest at it, then prunes: committed
  /// checkpoints beyond keep_last and uncommitted step directories older than N are removed.
  /// A crash at any point leaves DIR/step-N without a manifest (never loaded) or committed.
  bool commit(checkpoint_manifest manifest, const std::vector<std::string>& shards,
              std::string* error);

  /// The step directories that hold a manifest that parses, newest first (shards unchecked).
  std::vector<std::string> committed() const;

  /// The newest checkpoint that loads and verifies; each newer one that does not is skipped
  /// with its problem (naming the file) appended to `problems`.
  std::optional<loaded_checkpoint> load_latest(const std::string& config_hash,
                                               std::vector<std::string>* problems) const;

 private:
  std::string root_;
  int keep_last_;
  file_system* files_;
};

/// What `--resume PATH` names: a step directory, a checkpoints directory (with step-N
/// subdirectories), or a run's output directory (with checkpoints/). Loads the given step, or
/// the latest, falling back to older committed ones when it does not verify (each skipped one
/// in `problems`). Nothing, with `error` set, when no checkpoint there loads.
std::optional<loaded_checkpoint> resolve_resume(const std::string& path,
                                                const std::string& config_hash,
                                                std::vector<std::string>* problems,
                                                std::string* error);

}  // namespace troupe::actors
