#pragma once

#include <cstdint>

#include "actors/config/job_config.h"

namespace troupe::actors {

/// The learning rate of optimizer step `step` (counting from 0) under training.lr_schedule:
/// "constant", "cosine" (from lr down to 0 over total_steps) or "step" (lr times lr_decay every
/// lr_decay_epochs epochs), after a linear warm-up over warmup_steps.
double learning_rate_at(const training_config& training, int64_t step, int64_t steps_per_epoch,
                        int64_t total_steps);

}  // namespace troupe::actors
