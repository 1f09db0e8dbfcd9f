#pragma once

// A checkpoint's manifest.json: the job, its config hash, where the run stood, and each stage's
// shard with its size and xxh3-64 checksum. Reading one names the first missing or malformed
// field ("shards[1].bytes"), so that a damaged manifest is refused, never half-read.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::actors {

struct shard_entry {
  int32_t stage = 0;
  std::string file;  ///< relative to the checkpoint directory, e.g. "stage-0.shard"
  uint64_t bytes = 0;
  std::string xxh3;  ///< XXH3 64-bit of the file's bytes, 16 lowercase hex digits
};

struct checkpoint_manifest {
  int32_t format = 1;
  std::string job;          ///< the job's name (its file's stem), for people
  std::string config_hash;  ///< checkpoint_config_hash() of the job that wrote it
  int64_t step = 0;         ///< optimizer steps completed; the data-loader cursor
  int64_t epoch = 0;        ///< epochs completed (with their evaluation)
  int32_t stages = 1;
  /// The coordinator's progress (training_run::progress as JSON).
  nlohmann::json coordinator = nlohmann::json::object();
  std::vector<shard_entry> shards;  ///< one per stage, in stage order
  double created_unix_s = 0;
};

nlohmann::json to_json(const checkpoint_manifest& manifest);
/// Nothing, with `error` naming the missing or malformed field, when `json` is not a manifest.
std::optional<checkpoint_manifest> manifest_from_json(const nlohmann::json& json,
                                                      std::string* error);

}  // namespace troupe::actors
