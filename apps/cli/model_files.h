#pragma once

// Weights and jobs from the files runs leave behind, for the commands that read them back
// (export, generate).

#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/stage_state.h"
#include "actors/storage/checkpoint_store.h"

namespace troupe::apps {

/// Every shard of `checkpoint` parsed, in stage order; nothing, with `error` naming the shard's
/// file, when one does not parse or holds another stage than its place says.
std::optional<std::vector<actors::stage_state>> parse_shards(
    const actors::loaded_checkpoint& checkpoint, std::string* error);

/// The weights at `path`: a .safetensors file, or a checkpoint (anything `troupe inspect`
/// takes), named "stage{i}.{block}.{name}". Nothing, with `error` naming the file, otherwise.
std::optional<std::vector<actors::named_tensor>> read_weights(const std::string& path,
                                                              std::string* error);

/// The job of the weights at `path`: `job_file` when given, else the config.json that
/// `troupe train` wrote to the run directory holding them (searched from `path` upwards).
std::optional<actors::job_config> job_of_weights(const std::string& path,
                                                 const std::string& job_file, std::string* error);

/// A job from its resolved JSON form (DIR/config.json), as the TOML job file it came from.
std::optional<actors::job_config> load_job_json(const std::string& path, std::string* error);

}  // namespace troupe::apps
