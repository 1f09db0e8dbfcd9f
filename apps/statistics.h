#pragma once

// Small statistics the commands print: medians of repeated measurements.

#include <algorithm>
#include <vector>

namespace troupe::apps {

/// The middle value of `values` (the upper middle of an even count); 0 when there are none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace troupe::apps
