#pragma once

// Small statistics the commands print: medians and spreads of repeated measurements, and how
// well a prediction ranks what was measured.

#include <algorithm>
#include <cstddef>
#include <utility>
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

/// The smallest and largest of `values` (not empty), without the smallest and the largest
/// value when there are 5 or more: one run that crossed a target an evaluation early or late
/// does not stretch the range of the rest.
inline std::pair<double, double> middle_range(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t trim = values.size() >= 5 ? 1 : 0;
  return {values[trim], values[values.size() - 1 - trim]};
}

/// A pair of measured things, i before j.
struct ranked_pair {
  size_t i = 0, j = 0;
  bool apart = false;  ///< their measured middle ranges do not overlap
};

/// How a prediction orders pairs of things measured repeatedly (settings raced over seeds).
struct ranking_agreement {
  int pairs = 0;     ///< pairs with measurements and predictions on both sides, medians apart
  int agreeing = 0;  ///< of those, ordered by the predicted medians as by the measured ones
  int apart = 0;     ///< pairs whose measured middle_range()s do not overlap
  int apart_agreeing = 0;
  std::vector<ranked_pair> disagreeing;  ///< the pairs ordered otherwise
  /// Each thing's median, measured and predicted (0 where it has no values).
  std::vector<double> measured_medians, predicted_medians;
};

/// Compares the order of the medians of `predicted[i]` with that of `measured[i]`, pair by pair.
/// Pairs whose measured or predicted medians tie, or with no values on a side, are not ranked;
/// `apart` counts the pairs told apart beyond their runs' spread (the one's middle_range()
/// below the other's), whose order the noise of single runs cannot turn around.
inline ranking_agreement compare_rankings(const std::vector<std::vector<double>>& measured,
                                          const std::vector<std::vector<double>>& predicted) {
  ranking_agreement result;
  const size_t count = std::min(measured.size(), predicted.size());
  std::vector<std::pair<double, double>> ranges;  // each one's measured middle_range()
  for (size_t i = 0; i < count; ++i) {
    result.measured_medians.push_back(median(measured[i]));
    result.predicted_medians.push_back(median(predicted[i]));
    ranges.push_back(measured[i].empty() ? std::pair{0.0, 0.0} : middle_range(measured[i]));
  }
  for (size_t i = 0; i < count; ++i) {
    for (size_t j = i + 1; j < count; ++j) {
      if (measured[i].empty() || measured[j].empty() || predicted[i].empty() ||
          predicted[j].empty()) {
        continue;
      }
      const double was = result.measured_medians[i] - result.measured_medians[j];
      const double guessed = result.predicted_medians[i] - result.predicted_medians[j];
      if (was == 0 || guessed == 0) continue;
      const auto [low_i, high_i] = ranges[i];
      const auto [low_j, high_j] = ranges[j];
      const bool apart = high_i < low_j || high_j < low_i;
      const bool agrees = (was < 0) == (guessed < 0);
      ++result.pairs;
      result.agreeing += agrees;
      result.apart += apart;
      result.apart_agreeing += apart && agrees;
      if (!agrees) result.disagreeing.push_back({i, j, apart});
    }
  }
  return result;
}

}  // namespace troupe::apps
