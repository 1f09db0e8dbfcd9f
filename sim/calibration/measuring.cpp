#include "sim/calibration/measuring.h"

#include <algorithm>
#include <memory>
#include <vector>

namespace troupe::sim {

double cpu_seconds(clockid_t clock) {
  timespec now{};
  clock_gettime(clock, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

transport::message filled_message(transport::message_kind kind, size_t bytes) {
  transport::message message;
  message.header.kind = kind;
  const size_t floats = std::max<size_t>(1, bytes / sizeof(float));
  transport::add_payload(message, {static_cast<int64_t>(floats)},
                         std::make_shared<const std::vector<float>>(floats, 1.0f));
  return message;
}

}  // namespace troupe::sim
