#pragma once

// `troupe simulate`'s options as the simulator's settings: the calibrated profile, and the
// stragglers, link degradations and worker failures named on the command line.

#include <optional>
#include <string>

#include "apps/cli/commands.h"
#include "sim/simulation.h"

namespace troupe::apps {

/// The simulator's settings for `options` on `cluster`; a --profile also gives every device
/// port of `cluster` its measured ipc:// latency and bandwidth. Nothing, with `error` naming
/// the option and what is wrong with it, on bad input.
std::optional<sim::simulation_options> simulation_settings(const simulate_options& options,
                                                           sim::cluster_model* cluster,
                                                           std::string* error);

}  // namespace troupe::apps
