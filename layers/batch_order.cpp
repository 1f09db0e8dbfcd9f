// The seeded order in which an epoch visits a data set.

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "layers/check.h"
#include "layers/dataset.h"
#include "layers/random.h"

namespace troupe::layers {

batch_order::batch_order(int64_t sample_count, int64_t batch_size, uint64_t seed, bool shuffle,
                         bool drop_last)
    : sample_count_(sample_count),
      batch_size_(batch_size),
      seed_(seed),
      shuffle_(shuffle),
      drop_last_(drop_last) {
  TROUPE_CHECK(sample_count >= 0);
  TROUPE_CHECK(batch_size > 0);
  // Epoch 0 is laid out up front so that gather() is valid before the first start_epoch().
  start_epoch(0);
}

void batch_order::start_epoch(int64_t epoch) {
  TROUPE_CHECK(epoch >= 0);
  order_.resize(static_cast<size_t>(sample_count_));
  std::iota(order_.begin(), order_.end(), int64_t{0});
  if (!shuffle_) return;
  // An explicit Fisher-Yates shuffle: std::shuffle's output differs between standard libraries.
  random_generator generator(derive_seed(seed_, static_cast<uint64_t>(epoch)));
  for (int64_t i = sample_count_ - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(generator.below(static_cast<uint64_t>(i + 1)));
    std::swap(order_[i], order_[j]);
  }
}

int64_t batch_order::batches_per_epoch() const {
  if (drop_last_) return sample_count_ / batch_size_;
  return (sample_count_ + batch_size_ - 1) / batch_size_;
}

int64_t batch_order::batch_samples(int64_t index) const {
  TROUPE_CHECK(index >= 0 && index < batches_per_epoch());
  return std::min(batch_size_, sample_count_ - index * batch_size_);
}

void batch_order::gather(const dataset& data, int64_t index, float* features,
                         int32_t* labels) const {
  TROUPE_CHECK(data.count() == sample_count_);
  const int64_t samples = batch_samples(index);
  const int64_t sample_size = data.sample_size();
  const size_t row_bytes = static_cast<size_t>(sample_size) * sizeof(float);
  const int64_t* positions = order_.data() + index * batch_size_;
  const float* source = data.features.data();
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t sample = positions[i];
    std::memcpy(features + i * sample_size, source + sample * sample_size, row_bytes);
    std::copy_n(data.labels.begin() + sample * data.labels_per_sample, data.labels_per_sample,
                labels + i * data.labels_per_sample);
  }
}

}  // namespace troupe::layers
