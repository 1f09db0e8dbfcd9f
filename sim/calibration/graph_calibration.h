#pragma once

// `troupe calibrate` for a model graph (model.nodes): every node's visits timed at the row
// counts the job's own keys bring it (node_timing.h), the loss at a key's rows, the transport
// at the job's messages, and the coordinator's share of each key, into the machine_profile
// that the simulator charges per visit of each key's route.

#include <optional>
#include <string>

#include "actors/config/job_config.h"
#include "sim/profile.h"

namespace troupe::sim {

/// The profile of `config`'s graph on the job's first device with the threads a stage gets,
/// about `seconds` per node; nothing, with `error` set, when the job's data or model cannot be
/// loaded or a measurement fails.
std::optional<machine_profile> calibrate_graph(const actors::job_config& config, double seconds,
                                               std::string* error);

}  // namespace troupe::sim
