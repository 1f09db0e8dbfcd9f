#pragma once

// The checks of a job across its keys, once every key has been read on its own: combinations
// no single key can reject (micro-batches that do not divide the batch, a schedule or a
// staleness correction that needs another key, devices against collectives), and the defaults
// that depend on other keys (text data's path and input shape, max_active_keys,
// min_update_interval, cut points inside layers expanded).

#include <optional>
#include <string>

#include "actors/config/job_config.h"

namespace troupe::actors {

/// Rejects combinations no single key can, then resolves the defaults that depend on others;
/// nothing when the job holds together, else one line naming the keys.
std::optional<std::string> check_consistency(job_config* config);

}  // namespace troupe::actors
