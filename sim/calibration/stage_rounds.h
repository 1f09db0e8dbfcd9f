#pragma once

// One timed round of stages that share a device, as calibration runs them: the stages take
// turns key by key (each key's forward passes in stage order, the last stage turning it
// around), then the earlier stages' backward passes, then every stage's step.

#include <vector>

namespace troupe::sim {

/// `Timer` has keys_per_round(), forward_key(i), backward_key(i), last() and finish_round();
/// `timers` is not empty and its timers agree on keys_per_round().
template <typename Timer>
void run_stage_round(std::vector<Timer>& timers) {
  const int keys = timers.front().keys_per_round();
  for (int i = 0; i < keys; ++i) {
    for (Timer& timer : timers) {
      timer.forward_key(i);
      if (timer.last()) timer.backward_key(i);
    }
  }
  for (int i = 0; i < keys; ++i) {
    for (Timer& timer : timers) {
      if (!timer.last()) timer.backward_key(i);
    }
  }
  for (Timer& timer : timers) timer.finish_round();
}

}  // namespace troupe::sim
