#pragma once

// Blocks timed alone, fitted to what their stages cost as a pipeline stage runs them. Pure
// arithmetic over measured times: no clocks here.

#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/partition.h"
#include "sim/profile.h"

namespace troupe::sim {

/// Per key (forward, backward) and per step (step, stash) times of one stage.
struct stage_timing {
  double forward_s = 0, backward_s = 0, step_s = 0, stash_s = 0;
  double predict_s = 0;       ///< a predicted stash (staleness_correction = "predict"), per step
  actors::stage_range range;  ///< the stage's blocks in the job's partition
  double work_jitter = 0;     ///< log_spread() of its keys' forward and backward times
  /// A replicated stage's gradients out to host memory, a pass over them and back in, per
  /// float and per copy (half the round trip), timed between its rounds; 0 without replicas.
  double copy_s_per_float = 0;
  int64_t replica_floats = 0;  ///< of those gradients: the length of its all-reduce
};

/// Scales the times of each stage's blocks so that they add up to what the stage measured, as
/// the simulator adds them: the forwards, steps and stashes, and the backwards with the
/// first stage's blocks up to the first with parameters taken without their input gradient
/// (actors::blocks_without_input_gradient(), as the stage just timed ran them).
/// `timings[s].range` says which blocks stage s holds.
void fit_blocks_to_stages(const actors::job_config& config,
                          const std::vector<stage_timing>& timings,
                          std::vector<block_profile>* blocks);

}  // namespace troupe::sim
