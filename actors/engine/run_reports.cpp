#include "actors/engine/run_reports.h"

#include <algorithm>

namespace troupe::actors {

int64_t planned_steps(const job_config& config, int64_t train_samples) {
  const int64_t per_epoch = train_samples / config.training.batch_size;
  int64_t steps = per_epoch * config.training.epochs;
  if (config.training.max_steps > 0) steps = std::min(steps, config.training.max_steps);
  return steps;
}

}  // namespace troupe::actors
