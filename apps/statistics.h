#pragma once

// Small statistics the commands print: medians and spreads of repeated measurements.

#include <algorithm>
#include <vector>

namespace troupe::apps {

/// The middle value of `values` (the upper middle of an even count); 0 when there are none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/// How far apart repeated measurements of one quantity came out: the largest over the smallest,
/// less 1 (0.4: the largest is 40 % above the smallest); 0 for fewer than two positive values.
inline double spread(const std::vector<double>& values) {
  double smallest = 0, largest = 0;
  for (double value : values) {
    if (value <= 0) continue;
    smallest = smallest > 0 ? std::min(smallest, value) : value;
    largest = std::max(largest, value);
  }
  return smallest > 0 ? largest / smallest - 1 : 0;
}

}  // namespace troupe::apps
