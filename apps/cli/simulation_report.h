#pragma once

// What `troupe simulate` reports of one simulation: its summary.json entry, and the details of
// a lone run on stdout.

#include <nlohmann/json.hpp>

#include "sim/simulation.h"

namespace troupe::apps {

/// The simulation's figures as summary.json holds them; the final accuracy, losses and time
/// to target too when it computed the numerics.
nlohmann::json summary_json(const sim::simulation_result& result, bool numerics);

/// The stages' utilization, the links', the staleness histogram, each device's peak memory
/// and the run's figures, on stdout.
void print_details(const sim::simulation_result& result, bool numerics);

}  // namespace troupe::apps
