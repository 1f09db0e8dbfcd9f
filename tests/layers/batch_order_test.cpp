#include "layers/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace troupe::layers {
namespace {

bool is_permutation_of_indices(const std::vector<int64_t>& order, int64_t n) {
  std::vector<bool> seen(n, false);
  if (static_cast<int64_t>(order.size()) != n) return false;
  for (int64_t i : order) {
    if (i < 0 || i >= n || seen[i]) return false;
    seen[i] = true;
  }
  return true;
}

TEST(BatchOrderTest, ShuffleIsAPermutation) {
  batch_order order(1000, 32, 7, true, true);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    order.start_epoch(epoch);
    EXPECT_TRUE(is_permutation_of_indices(order.order(), 1000)) << epoch;
  }
}

TEST(BatchOrderTest, SameSeedAndEpochGiveTheSameOrder) {
  batch_order first(500, 10, 42, true, false);
  batch_order second(500, 10, 42, true, false);
  first.start_epoch(3);
  second.start_epoch(1);
  second.start_epoch(3);
  EXPECT_EQ(first.order(), second.order());
}

TEST(BatchOrderTest, EpochsAndSeedsGiveDifferentOrders) {
  batch_order order(500, 10, 42, true, false);
  order.start_epoch(0);
  std::vector<int64_t> epoch_zero = order.order();
  order.start_epoch(1);
  EXPECT_NE(order.order(), epoch_zero);
  std::vector<int64_t> identity(500);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  EXPECT_NE(epoch_zero, identity);
  batch_order other_seed(500, 10, 43, true, false);
  other_seed.start_epoch(0);
  EXPECT_NE(other_seed.order(), epoch_zero);
}

TEST(BatchOrderTest, OrderIsPinnedForASeed) {
  // The order must not change between builds or standard libraries: a resumed run relies on it.
  batch_order order(10, 5, 1234, true, false);
  order.start_epoch(2);
  EXPECT_EQ(order.order(), (std::vector<int64_t>{4, 6, 7, 5, 1, 3, 0, 8, 9, 2}));
}

TEST(BatchOrderTest, IdentityWithoutShuffle) {
  batch_order order(7, 3, 42, false, false);
  order.start_epoch(5);
  EXPECT_EQ(order.order(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
}

TEST(BatchOrderTest, DropLastSkipsThePartialBatch) {
  batch_order order(10, 4, 1, true, true);
  EXPECT_EQ(order.batches_per_epoch(), 2);
  EXPECT_EQ(order.batch_samples(0), 4);
  EXPECT_EQ(order.batch_samples(1), 4);
  EXPECT_EQ(batch_order(8, 4, 1, true, true).batches_per_epoch(), 2);
  EXPECT_EQ(batch_order(3, 4, 1, true, true).batches_per_epoch(), 0);
}

TEST(BatchOrderTest, KeepsThePartialBatchOtherwise) {
  batch_order order(10, 4, 1, false, false);
  EXPECT_EQ(order.batches_per_epoch(), 3);
  EXPECT_EQ(order.batch_samples(1), 4);
  EXPECT_EQ(order.batch_samples(2), 2);
  EXPECT_EQ(batch_order(8, 4, 1, false, false).batches_per_epoch(), 2);
  EXPECT_EQ(batch_order(0, 4, 1, false, false).batches_per_epoch(), 0);
}

TEST(BatchOrderTest, GatherCopiesRowsInOrder) {
  dataset data = make_synthetic_dataset(11, {2, 3}, 5, 9);
  batch_order order(11, 4, 77, true, false);
  order.start_epoch(4);
  int64_t seen = 0;
  for (int64_t batch = 0; batch < order.batches_per_epoch(); ++batch) {
    int64_t samples = order.batch_samples(batch);
    std::vector<float> features(samples * 6, -1.0f);
    std::vector<int32_t> labels(samples, -1);
    order.gather(data, batch, features.data(), labels.data());
    for (int64_t i = 0; i < samples; ++i) {
      int64_t sample = order.order()[batch * 4 + i];
      EXPECT_EQ(labels[i], data.labels[sample]);
      for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(features[i * 6 + j], data.features[sample * 6 + j]);
    }
    seen += samples;
  }
  EXPECT_EQ(seen, 11);
}

TEST(SyntheticDatasetTest, HasTheRequestedShape) {
  dataset data = make_synthetic_dataset(300, {1, 4, 4}, 6, 3);
  EXPECT_EQ(data.name, "synthetic");
  EXPECT_EQ(data.count(), 300);
  EXPECT_EQ(data.sample_shape, (shape{1, 4, 4}));
  EXPECT_EQ(data.classes, 6);
  EXPECT_EQ(data.features.size(), 300u * 16);
  for (float value : data.features) EXPECT_TRUE(std::isfinite(value));
}

TEST(SyntheticDatasetTest, LabelsAreRoughlyBalanced) {
  dataset data = make_synthetic_dataset(5000, {8}, 10, 21);
  std::vector<int> per_class(10, 0);
  for (int32_t label : data.labels) {
    ASSERT_TRUE(label >= 0 && label < 10) << label;
    ++per_class[label];
  }
  for (int n : per_class) {
    EXPECT_GT(n, 400);
    EXPECT_LT(n, 600);
  }
}

TEST(SyntheticDatasetTest, IsDeterministicPerSeed) {
  dataset first = make_synthetic_dataset(200, {5, 3}, 4, 99);
  dataset second = make_synthetic_dataset(200, {5, 3}, 4, 99);
  dataset other = make_synthetic_dataset(200, {5, 3}, 4, 100);
  EXPECT_EQ(first.features, second.features);
  EXPECT_EQ(first.labels, second.labels);
  EXPECT_NE(first.features, other.features);
  EXPECT_NE(first.labels, other.labels);
}

TEST(SyntheticDatasetTest, NoiseIsStandardNormalAroundPrototypes) {
  // Differences between two samples of one class are noise alone, with variance 2.
  dataset data = make_synthetic_dataset(4000, {50}, 2, 8);
  std::vector<int64_t> class_zero;
  for (int64_t i = 0; i < data.count(); ++i) {
    if (data.labels[i] == 0) class_zero.push_back(i);
  }
  double sum = 0, squares = 0;
  int64_t n = 0;
  for (size_t k = 0; k + 1 < class_zero.size(); k += 2) {
    for (int64_t j = 0; j < 50; ++j) {
      double difference =
          data.features[class_zero[k] * 50 + j] - data.features[class_zero[k + 1] * 50 + j];
      sum += difference;
      squares += difference * difference;
      ++n;
    }
  }
  EXPECT_NEAR(sum / n, 0.0, 0.05);
  EXPECT_NEAR(squares / n, 2.0, 0.1);
}

/// Accuracy of the nearest-class-mean classifier fit on the first half, tested on the second.
double nearest_mean_accuracy(const dataset& data) {
  const int64_t size = data.sample_size(), half = data.count() / 2;
  std::vector<double> means(data.classes * size, 0.0);
  std::vector<int64_t> counts(data.classes, 0);
  for (int64_t i = 0; i < half; ++i) {
    ++counts[data.labels[i]];
    for (int64_t j = 0; j < size; ++j) {
      means[data.labels[i] * size + j] += data.features[i * size + j];
    }
  }
  for (int64_t c = 0; c < data.classes; ++c) {
    for (int64_t j = 0; j < size; ++j) means[c * size + j] /= std::max<int64_t>(counts[c], 1);
  }
  int64_t correct = 0;
  for (int64_t i = half; i < data.count(); ++i) {
    int best = 0;
    double best_distance = INFINITY;
    for (int c = 0; c < data.classes; ++c) {
      double distance = 0;
      for (int64_t j = 0; j < size; ++j) {
        double d = data.features[i * size + j] - means[c * size + j];
        distance += d * d;
      }
      if (distance < best_distance) best_distance = distance, best = c;
    }
    correct += best == data.labels[i];
  }
  return static_cast<double>(correct) / static_cast<double>(data.count() - half);
}

TEST(SyntheticDatasetTest, IsLearnableButNotTrivial) {
  // A linear classifier (nearest class mean) does far better than chance (10%), short of 100%.
  for (shape sample_shape : {shape{16}, shape{1, 28, 28}}) {
    double accuracy = nearest_mean_accuracy(make_synthetic_dataset(4000, sample_shape, 10, 5));
    EXPECT_GT(accuracy, 0.5) << to_string(sample_shape);
    EXPECT_LT(accuracy, 0.99) << to_string(sample_shape);
  }
}

}  // namespace
}  // namespace troupe::layers
