#pragma once

// Small helpers shared by the test suites.

#include <memory>
#include <string>
#include <vector>

#include "layers/backend_registry.h"
#include "layers/layer_spec.h"
#include "layers/random.h"
#include "layers/tensor.h"

namespace troupe::testing {

/// A one-thread CPU backend: the reference every test computes on.
inline std::unique_ptr<layers::backend> cpu_backend() {
  std::string error;
  return layers::create_backend("cpu", 1, &error);
}

/// A block of `type` with the given width, kernel and padding (the rest at their defaults).
inline layers::layer_spec layer_block(const std::string& type, int out = 0, int kernel = 0,
                                      int padding = 0) {
  layers::layer_spec spec;
  spec.type = type;
  spec.out = out;
  spec.kernel = kernel;
  spec.padding = padding;
  return spec;
}

inline std::vector<float> random_values(size_t count, uint64_t seed, float low = -1.0f,
                                        float high = 1.0f) {
  layers::random_generator generator(seed);
  std::vector<float> values(count);
  for (float& v : values) v = generator.uniform(low, high);
  return values;
}

inline layers::tensor random_tensor(layers::backend& device, layers::shape dims, uint64_t seed) {
  auto values = random_values(layers::element_count(dims), seed);
  return layers::tensor::from_host(device, device.default_stream(), dims, values);
}

}  // namespace troupe::testing
