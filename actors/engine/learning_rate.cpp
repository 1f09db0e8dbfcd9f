#include "actors/engine/learning_rate.h"

#include <cmath>

namespace troupe::actors {

double learning_rate_at(const training_config& training, int64_t step, int64_t steps_per_epoch,
                        int64_t total_steps) {
  double rate = training.lr;
  if (training.lr_schedule == lr_schedule_kind::cosine && total_steps > 0) {
    const double progress = static_cast<double>(step) / static_cast<double>(total_steps);
    rate = 0.5 * training.lr * (1.0 + std::cos(M_PI * std::fmin(progress, 1.0)));
  } else if (training.lr_schedule == lr_schedule_kind::step && training.lr_decay_epochs > 0 &&
             steps_per_epoch > 0) {
    const int64_t epoch = step / steps_per_epoch;
    rate = training.lr * std::pow(training.lr_decay, epoch / training.lr_decay_epochs);
  }
  if (training.warmup_steps > 0 && step < training.warmup_steps) {
    rate *= static_cast<double>(step + 1) / static_cast<double>(training.warmup_steps);
  }
  return rate;
}

}  // namespace troupe::actors
