#pragma once

// Clock and observer stand-ins for tests that drive the real engine hosts.

#include <chrono>

#include "actors/training_loop.h"

namespace troupe::testing {

/// The monotonic clock; safe from any thread, as the hosts require.
class wall_clock final : public actors::clock_source {
 public:
  double now_seconds() override {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  }
};

/// Ignores progress and metrics.
class quiet_observer final : public actors::training_observer {
 public:
  void on_step(int64_t, int64_t, int64_t, double, double) override {}
  void on_metrics(const actors::metrics_record&) override {}
};

}  // namespace troupe::testing
