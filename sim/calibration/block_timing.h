#pragma once

// Timing a job's blocks one at a time on this machine, for real (real clocks): for `troupe
// calibrate`'s machine profile and for parallelism.partition = "measured".

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/partition.h"
#include "layers/backend.h"
#include "layers/tensor.h"
#include "sim/profile.h"

namespace troupe::sim {

/// The learning rate of a timed optimizer step: above 0, so that the step computes every term of
/// the update as in training (AdamW's decoupled decay, lr · weight_decay · w, is skipped at 0),
/// and too small to move a weight.
inline constexpr float kTimedStepLearningRate = 1e-12f;

/// Times forward, backward (with and without the input gradient), a weight stash and the step
/// of block `index` alone on `device` for keys of `batch` samples of shape `input`, after an
/// untimed round, repeating until `seconds` have passed and at least `min_rounds` rounds ran
/// (half of them with the input gradient); then, with `evaluation`, evaluation forwards back to
/// back for a quarter of `seconds` (at least three, after an untimed one); medians.
block_profile time_block(const actors::job_config& config, size_t index, layers::backend& device,
                         const layers::shape& input, int64_t batch, double seconds, int min_rounds,
                         bool evaluation);

/// Every block's cost per key in seconds for parallelism.partition = "measured", on the job's
/// first device with the threads one stage gets: the blocks take turns at time_block()'s rounds
/// for about `seconds` each (at least six rounds); the optimizer step is divided by the keys
/// between steps, and a block's message is the CPU time of sending and receiving its output
/// between two stages of one process (taken_message_cpu_seconds()). `progress` (may be null) gets a
/// line when the whole takes more than a second. Nothing, with `error` set, when the device
/// cannot be set up or the model's shapes do not chain.
std::optional<std::vector<actors::block_cost>> measure_block_costs(const actors::job_config& config,
                                                                   double seconds,
                                                                   std::FILE* progress,
                                                                   std::string* error);

}  // namespace troupe::sim
