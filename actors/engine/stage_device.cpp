#include "actors/engine/stage_device.h"

#include <algorithm>

#include "layers/check.h"

namespace troupe::actors {

std::vector<float> stage_device::gradient_values() {
  const std::vector<layers::parameter*> all = parameters();
  std::vector<float> values;
  values.reserve(static_cast<size_t>(gradient_value_count()));
  for (layers::parameter* p : all) {
    if (!p->has_gradient) {
      values.insert(values.end(), static_cast<size_t>(p->value.size()), 0.0f);
      continue;
    }
    // Every method returns with its work finished, so the default stream may read it.
    const std::vector<float> host = p->gradient.to_host(p->gradient.device().default_stream());
    values.insert(values.end(), host.begin(), host.end());
  }
  for (layers::parameter* p : all) values.push_back(p->has_gradient ? 1.0f : 0.0f);
  return values;
}

void stage_device::set_gradient_values(const std::vector<float>& values) {
  TROUPE_CHECK(static_cast<int64_t>(values.size()) == gradient_value_count());
  const std::vector<layers::parameter*> all = parameters();
  size_t offset = 0;
  const size_t flags = values.size() - all.size();
  for (size_t i = 0; i < all.size(); ++i) {
    layers::parameter& p = *all[i];
    const bool touched = values[flags + i] > 0;
    if (touched) {
      layers::backend& device = p.gradient.device();
      p.gradient.copy_from_host(device.default_stream(), values.data() + offset);
      device.synchronize(device.default_stream());
    }
    p.has_gradient = touched;
    offset += static_cast<size_t>(p.value.size());
  }
}

int64_t stage_device::gradient_value_count() {
  int64_t count = 0;
  for (layers::parameter* p : parameters()) count += p->value.size() + 1;
  return count;
}

std::vector<float> stage_device::weight_values() {
  std::vector<float> values;
  values.reserve(static_cast<size_t>(weight_value_count()));
  for (layers::parameter* p : parameters()) {
    const std::vector<float> host = p->value.to_host(p->value.device().default_stream());
    values.insert(values.end(), host.begin(), host.end());
  }
  return values;
}

void stage_device::set_weight_values(const std::vector<float>& values) {
  TROUPE_CHECK(static_cast<int64_t>(values.size()) == weight_value_count());
  size_t offset = 0;
  for (layers::parameter* p : parameters()) {
    layers::backend& device = p->value.device();
    p->value.copy_from_host(device.default_stream(), values.data() + offset);
    device.synchronize(device.default_stream());
    offset += static_cast<size_t>(p->value.size());
  }
}

int64_t stage_device::weight_value_count() {
  int64_t count = 0;
  for (layers::parameter* p : parameters()) count += p->value.size();
  return count;
}

}  // namespace troupe::actors
