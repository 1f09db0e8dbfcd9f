#pragma once

// Small tools that calibration's measurements share.

#include <time.h>

#include <cstddef>

#include "transport/message.h"

namespace troupe::sim {

/// CPU seconds so far on `clock`: CLOCK_THREAD_CPUTIME_ID (this thread's) or
/// CLOCK_PROCESS_CPUTIME_ID (all of this process's threads').
double cpu_seconds(clockid_t clock);

/// A message of `kind` whose one payload is `bytes` of floats (at least one float).
transport::message filled_message(transport::message_kind kind, size_t bytes);

}  // namespace troupe::sim
