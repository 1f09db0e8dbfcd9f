#include "actors/engine/run_reports.h"

#include <algorithm>

namespace troupe::actors {

int64_t planned_steps(const job_config& config, int64_t train_samples) {
  const int64_t per_epoch = train_samples / config.training.batch_size;
  int64_t steps = per_epoch * config.training.epochs;
  if (config.training.max_steps > 0) steps = std::min(steps, config.training.max_steps);
  return steps;
}

std::optional<double> mean_staleness(const std::vector<int64_t>& histogram) {
  double passes = 0, total = 0;
  for (size_t s = 0; s < histogram.size(); ++s) {
    passes += static_cast<double>(histogram[s]);
    total += static_cast<double>(s) * static_cast<double>(histogram[s]);
  }
  if (passes <= 0) return std::nullopt;
  return total / passes;
}

}  // namespace troupe::actors
