#pragma once

// What the CPU backend's tests share: the backend, device arrays that copy host values in and
// out, and random values.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "layers/cpu/cpu_backend.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers::cpu_testing {

inline const float nan_value = std::numeric_limits<float>::quiet_NaN();

inline backend& cpu() {
  static std::unique_ptr<backend> device = make_cpu_backend(1);
  return *device;
}

/// Device memory holding a copy of host values, freed on destruction.
template <typename T>
class device_array {
 public:
  explicit device_array(const std::vector<T>& values)
      : size_(values.size()), data_(static_cast<T*>(cpu().allocate(size_ * sizeof(T)))) {
    cpu().copy_host_to_device(cpu().default_stream(), data_, values.data(), size_ * sizeof(T));
  }
  explicit device_array(size_t size, T value = T()) : device_array(std::vector<T>(size, value)) {}
  ~device_array() { cpu().deallocate(data_); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;

  T* data() const { return data_; }
  std::vector<T> host() const {
    std::vector<T> values(size_);
    cpu().copy_device_to_host(cpu().default_stream(), values.data(), data_, size_ * sizeof(T));
    cpu().synchronize(cpu().default_stream());
    return values;
  }

 private:
  size_t size_;
  T* data_;
};

using floats = device_array<float>;

using ::troupe::testing::random_values;

inline void expect_near_all(const std::vector<float>& actual, const std::vector<float>& expected,
                            float tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], tolerance * (1.0f + std::fabs(expected[i])))
        << "at index " << i;
  }
}

inline stream s() { return cpu().default_stream(); }

}  // namespace troupe::layers::cpu_testing
