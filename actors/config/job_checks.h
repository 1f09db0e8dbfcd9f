#pragma once

// The checks of a job across its keys, once every key has been read on its own: combinations
// no single key can reject (micro-batches that do not divide the batch, a schedule or a
// staleness correction that needs another key, devices against collectives), and the defaults
// that depend on other keys (a sync pipeline's micro_batches, text data's path and input shape,
// max_active_keys, min_update_interval, cut points inside layers expanded).

#include <optional>
#include <set>
#include <string>

#include "actors/config/job_config.h"

namespace troupe::actors {

/// Rejects combinations no single key can, then resolves the defaults that depend on others;
/// nothing when the job holds together, else one line naming the keys. `set_keys` names the
/// keys the job file and its overrides gave ("parallelism.micro_batches"): a default that
/// depends on other keys is resolved only for a key not among them.
std::optional<std::string> check_consistency(job_config* config,
                                             const std::set<std::string>& set_keys);

/// The micro-batches of a sync pipeline whose job leaves parallelism.micro_batches unset: the
/// smallest divisor of batch_size / replicas from stages up to 2 × stages, so that every stage
/// holds a key at once; failing that, the largest divisor below stages (batch_size / replicas
/// itself, keys of one sample, when that is fewer than the stages). 1 for one stage, in async
/// mode, or for a job refused anyway (replicas that do not divide the batch, more stages than
/// blocks).
int default_micro_batches(const job_config& config);

}  // namespace troupe::actors
