#pragma once

// Shared by the CUDA test files: the CPU/CUDA backend pair and comparison helpers. Every
// test using them skips itself when no CUDA device is present.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "layers/backend.h"
#include "layers/backend_registry.h"
#include "layers/random.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers::cuda_testing {

/// The CPU reference and the CUDA device under test.
struct backend_pair {
  std::unique_ptr<backend> cpu;
  std::unique_ptr<backend> cuda;
  std::string error;
};

inline backend_pair open_backends() {
  backend_pair pair;
  pair.cpu = create_backend("cpu", 1, &pair.error);
  if (pair.cpu) pair.cuda = create_backend("cuda", 0, &pair.error);
  return pair;
}

/// `count` values of T in one backend's memory; freed, after its default stream drains, when
/// the array goes. Uploads and downloads go through the default stream and wait for it.
template <typename T>
class device_array {
 public:
  device_array(backend& device, size_t count)
      : device_(device),
        count_(count),
        data_(static_cast<T*>(device.allocate(count * sizeof(T)))) {}
  device_array(backend& device, const std::vector<T>& values)
      : device_array(device, values.size()) {
    upload(values);
  }
  ~device_array() {
    device_.synchronize(device_.default_stream());
    device_.deallocate(data_);
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;

  T* data() const { return data_; }

  void upload(const std::vector<T>& values) {
    const stream s = device_.default_stream();
    device_.copy_host_to_device(s, data_, values.data(), values.size() * sizeof(T));
    device_.synchronize(s);
  }

  std::vector<T> download() const {
    std::vector<T> values(count_);
    const stream s = device_.default_stream();
    device_.copy_device_to_host(s, values.data(), data_, count_ * sizeof(T));
    device_.synchronize(s);
    return values;
  }

 private:
  backend& device_;
  size_t count_;
  T* data_;
};

using outputs = std::vector<std::vector<float>>;

struct tolerance {
  double relative = 0.0;
  double absolute = 0.0;
};
constexpr tolerance exact{0.0, 0.0};
/// Single roundings that may differ (fused multiply-add, transcendental functions).
constexpr tolerance rounding{1e-5, 1e-6};
/// Sums of `terms` values of magnitude about 1, added in different orders.
inline tolerance summed(double terms) { return {1e-5, 1e-6 * std::max(1.0, terms)}; }

const float nan_value = std::numeric_limits<float>::quiet_NaN();

using ::troupe::testing::random_values;

/// Values from {0, 0.5, 1, 1.5}, so that maxima tie often.
inline std::vector<float> tied_floats(size_t count, uint64_t seed) {
  std::vector<float> values = random_values(count, seed, 0.0f, 4.0f);
  for (float& v : values) v = std::floor(v) * 0.5f;
  return values;
}

inline std::vector<float> as_floats(const std::vector<int32_t>& values) {
  return std::vector<float>(values.begin(), values.end());
}

/// Expects |expected - actual| <= absolute + relative * |expected| everywhere (NaN matches NaN).
inline void expect_close(const std::vector<float>& expected, const std::vector<float>& actual,
                         tolerance t, const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  size_t mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double e = expected[i];
    const double a = actual[i];
    const bool close = (std::isnan(e) && std::isnan(a)) || e == a ||
                       std::fabs(e - a) <= t.absolute + t.relative * std::fabs(e);
    if (!close && ++mismatches <= 5) {
      ADD_FAILURE() << what << " [" << i << "]: cpu " << std::setprecision(9) << e << ", cuda "
                    << a;
    }
  }
  EXPECT_EQ(mismatches, 0u) << what << ": " << mismatches << " of " << expected.size();
}

/// Runs `op` (backend& -> outputs) on both backends and compares every output.
template <typename Op>
void expect_parity(backend_pair& pair, const Op& op, tolerance t, const std::string& what) {
  const outputs expected = op(*pair.cpu);
  const outputs actual = op(*pair.cuda);
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    expect_close(expected[i], actual[i], t, what + " output " + std::to_string(i));
  }
}

inline bool has_nan(const std::vector<float>& values) {
  return std::any_of(values.begin(), values.end(), [](float v) { return std::isnan(v); });
}

inline int output_size(int size, int kernel, int stride, int padding) {
  return (size + 2 * padding - kernel) / stride + 1;
}

inline convolution_geometry make_convolution(int batch, int channels, int height, int width,
                                             int kernel, int stride, int padding) {
  convolution_geometry g{batch, channels, height, width, kernel, stride, padding};
  g.out_height = output_size(height, kernel, stride, padding);
  g.out_width = output_size(width, kernel, stride, padding);
  return g;
}

inline pooling_geometry make_pooling(int batch, int channels, int height, int width, int kernel,
                                     int stride) {
  pooling_geometry g{batch, channels, height, width, kernel, stride};
  g.out_height = output_size(height, kernel, stride, 0);
  g.out_width = output_size(width, kernel, stride, 0);
  return g;
}

/// Labels that are the first maximal logit, the last maximal logit or random, in turn.
inline std::vector<int32_t> labels_for(const std::vector<float>& logits, int rows, int cols) {
  random_generator generator(92);
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) {
    const float* row = logits.data() + size_t(r) * cols;
    int first_max = 0, last_max = 0;
    for (int c = 1; c < cols; ++c) {
      if (row[c] > row[first_max]) first_max = c;
      if (row[c] >= row[last_max]) last_max = c;
    }
    const int random = int(generator.below(cols));
    labels[r] = r % 3 == 0 ? first_max : r % 3 == 1 ? last_max : random;
  }
  return labels;
}

#define TROUPE_REQUIRE_CUDA(pair)      \
  backend_pair pair = open_backends(); \
  ASSERT_TRUE(pair.cpu != nullptr && pair.cuda != nullptr) << pair.error

}  // namespace troupe::layers::cuda_testing
