#pragma once

// A clock for tests that drive the real engine hosts.

#include <chrono>

#include "actors/engine/run_reports.h"

namespace troupe::testing {

/// The monotonic clock; safe from any thread, as the hosts require.
class wall_clock final : public actors::clock_source {
 public:
  double now_seconds() override {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  }
};

}  // namespace troupe::testing
