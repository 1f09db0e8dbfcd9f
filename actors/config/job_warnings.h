#pragma once

// Advice about a job that is valid but may not do what its keys suggest: a key set that does
// nothing in the job's mode (min_update_interval in a sync pipeline, replica keys with one
// replica), a sync pipeline of one micro-batch, a recoverable run without checkpoints. Each is
// one line naming the key; a key the job leaves unset never warns. The commands that run a job
// print them; the configuration layer only says them.

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/config/job_config.h"

namespace troupe::actors {

/// One line per key of `set_keys` ("section.key", the keys the job file and its overrides
/// gave) that does nothing in `config`'s mode, such as "parallelism.min_update_interval does
/// nothing in sync mode: ...", and for an explicit micro_batches = 1 in a sync pipeline (its
/// stages work one at a time). A key set to its default value does nothing in any mode and
/// does not warn. `config` is the resolved configuration of those keys.
std::vector<std::string> job_warnings(const job_config& config,
                                      const std::set<std::string>& set_keys);

/// For a run that recovers from a lost worker (stages in worker processes): one line when
/// checkpoint.max_restarts allows a recovery but no checkpoint interval is set, since every
/// recovery then trains from step 0 again. Nothing otherwise.
std::optional<std::string> recovery_warning(const job_config& config);

}  // namespace troupe::actors
