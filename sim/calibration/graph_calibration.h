#pragma once

// `troupe calibrate` for a model graph (model.nodes): every node's visits timed at the row
// counts the job's own keys bring it (node_timing.h), the loss at a key's rows, the transport
// at the job's messages, and the coordinator's share of each key, into the machine_profile
// that the simulator charges per visit of each key's route.

#include <optional>
#include <string>

#include <cstdio>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/partition.h"
#include "sim/profile.h"

namespace troupe::sim {

/// The profile of `config`'s graph on the job's first device with the threads a stage gets,
/// about `seconds` per node; nothing, with `error` set, when the job's data or model cannot be
/// loaded or a measurement fails.
std::optional<machine_profile> calibrate_graph(const actors::job_config& config, double seconds,
                                               std::string* error);

/// Every node's cost per key for parallelism.partition = "measured" (what measure_block_costs()
/// gives a graph): its visits timed alone for about `seconds` (node_timing.h), charged over the
/// visits of keys drawn from the job's data and averaged; a loop or tree node's backward always
/// computes its input gradient. The step is divided by the keys between steps, and a node's
/// message is the CPU time of sending and receiving its output rows of a median key between two
/// stages of one process. `progress` (may be null) gets a line first. Nothing, with `error`
/// set, when the job's data or device cannot be set up.
std::optional<std::vector<actors::block_cost>> measure_node_costs(const actors::job_config& config,
                                                                  double seconds,
                                                                  std::FILE* progress,
                                                                  std::string* error);

}  // namespace troupe::sim
