#pragma once

// The clock of a real run (the hosts, the command line, programs embedding troupe): monotonic
// seconds. Engine logic never reads it; hosts pass its readings in.

#include <chrono>

#include "actors/engine/run_reports.h"

namespace troupe::actors {

class steady_clock final : public clock_source {
 public:
  double now_seconds() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace troupe::actors
