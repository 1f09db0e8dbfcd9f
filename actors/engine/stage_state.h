#pragma once

// Everything one stage needs to continue a run exactly: its weights, the gradients it has
// accumulated towards the next optimizer step, the optimizer's state, and its weight version.
// A checkpoint holds one of these per stage as a Cereal shard (portable binary, little-endian).
// Randomness needs no state of its own: dropout masks derive from (seed, step, sample).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::actors {

/// A named float32 tensor in host memory, row-major.
struct named_tensor {
  std::string name;  ///< e.g. "linear2.weight" (block type and index in model.layers)
  std::vector<int64_t> dims;
  std::vector<float> values;
};

struct stage_state {
  int32_t stage = 0;
  int32_t stages = 1;
  int64_t first_block = 0;  ///< the stage's blocks of model.layers: [first_block, last_block)
  int64_t last_block = 0;
  int64_t weight_version = 0;   ///< optimizer steps this stage has taken
  int64_t keys_since_step = 0;  ///< backward passes accumulated towards the next step
  int64_t optimizer_steps = 0;  ///< the optimizer's own count (Adam's bias correction)
  uint64_t seed = 0;            ///< training.seed: names every dropout stream
  std::vector<named_tensor> parameters;
  /// Accumulated weight gradients, only of parameters that received some since the last step.
  std::vector<named_tensor> gradients;
  /// "<parameter>.velocity" (SGD with momentum) or "<parameter>.exp_avg" and ".exp_avg_sq"
  /// (Adam), in parameter order.
  std::vector<named_tensor> optimizer_state;
};

/// The shard bytes of `state`: a magic, a format version, then the fields.
std::string serialize_stage_state(const stage_state& state);

/// Parses shard bytes, checking every count against the bytes that remain before allocating.
/// Nothing, with `error` saying what is wrong, for bytes that are not a complete shard.
/// A shard whose counters cannot be a stage's (a negative version or keys_since_step, a stage
/// outside its count, no blocks) is refused the same way.
std::optional<stage_state> parse_stage_state(const void* data, size_t bytes, std::string* error);
/// parse_stage_state() of the magic, format and counters only: the tensors are neither read
/// nor checked, and the state holds none (a cheap look at a large shard).
std::optional<stage_state> parse_stage_state_counters(const void* data, size_t bytes,
                                                      std::string* error);

/// One shard per stage from the shards of every stage actor of a replicated run (replica by
/// replica, `stages` each): replica 0's where every replica holds the same bytes (sync mode),
/// else one whose tensors are the replicas' means (async mode) with replica 0's counters.
/// Empty, with `error` saying why, when a shard does not parse or the replicas' shapes differ.
std::vector<std::string> merge_replica_states(std::vector<std::string> shards, int stages,
                                              std::string* error);

/// Number of float values in all tensors of `state`.
int64_t stage_state_values(const stage_state& state);

}  // namespace troupe::actors
