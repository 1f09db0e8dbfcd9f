// The simulator's side of `troupe converge`: a run's outcome, real or simulated, and the race's
// runs simulated on this machine from their calibrations, side by side on its cores once the
// race is over.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "sim/profile.h"

namespace troupe::apps {

/// One run's outcome, real or simulated.
struct race_outcome {
  bool diverged = false;
  bool failed = false;  ///< ended with an error other than divergence (counted apart)
  std::optional<double> to_target_s;
  std::optional<int64_t> to_target_step;  ///< optimizer steps completed when it reached it
  double final_accuracy = 0;
  /// Mean staleness of the backward passes, all stages together (versions a key's weights
  /// fell behind between its forward and backward pass): where an async prediction learns
  /// faster or slower than the real run, this is the first thing to compare.
  std::optional<double> mean_staleness;
};

/// "target after 131.8 s, final accuracy 0.2342" (or failed, diverged, target not reached).
std::string described(const race_outcome& run);

/// The mean staleness of every backward pass of every stage (entry i of a stage's histogram
/// counts its passes of staleness i), real runs and simulated ones alike; none without passes.
std::optional<double> mean_staleness(const std::vector<std::vector<int64_t>>& stages);

/// A run of the race to simulate: the job file with these overrides (its setting's and its
/// seed), from this profile.
struct run_to_simulate {
  size_t setting = 0;  ///< its index among the race's settings
  std::string name;    ///< the setting's
  int seed = 1;
  std::vector<std::string> overrides;
  sim::machine_profile profile;
};

/// How many simulations run at once: each simulation's numerics compute on the threads its
/// run's stages had (actors::threads_per_stage), so this many fill the job's threads without
/// sharing a core. At least 1.
int simulations_at_once(const std::vector<actors::job_config>& configs);

/// Simulates every run (numerics on), `parallel` at a time, printing a line as each ends; the
/// outcomes in the order of `runs`, or nothing with `error` naming the first run whose
/// simulation failed (a diverged simulation is an outcome, not a failure). The simulations are
/// deterministic, so running them side by side changes no figure.
std::optional<std::vector<race_outcome>> simulate_runs(const std::string& job_file,
                                                       const std::vector<run_to_simulate>& runs,
                                                       int parallel, std::string* error);

}  // namespace troupe::apps
