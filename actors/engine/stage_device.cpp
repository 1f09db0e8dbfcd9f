#include "actors/engine/stage_device.h"

#include <algorithm>

#include "layers/check.h"

namespace troupe::actors {

/// Queues the copy of `tensor` (finished, as every method leaves it) into `into`; it is done
/// after finish_copies().
static void copy_out(const layers::tensor& tensor, float* into) {
  if (tensor.size() == 0) return;
  layers::backend& device = tensor.device();
  device.copy_device_to_host(device.default_stream(), into, tensor.data(),
                             static_cast<size_t>(tensor.size()) * sizeof(float));
}

/// Waits once per device for the copies queued on the parameters' default streams.
static void finish_copies(const std::vector<layers::parameter*>& all) {
  std::vector<layers::backend*> devices;
  for (layers::parameter* p : all) {
    layers::backend* device = &p->value.device();
    if (std::find(devices.begin(), devices.end(), device) == devices.end()) {
      devices.push_back(device);
      device->synchronize(device->default_stream());
    }
  }
}

void stage_device::read_gradient_values(std::vector<float>* values) {
  const std::vector<layers::parameter*> all = parameters();
  values->resize(static_cast<size_t>(gradient_value_count()));
  float* next = values->data();
  for (layers::parameter* p : all) {
    if (p->has_gradient) {
      copy_out(p->gradient, next);
    } else {
      std::fill(next, next + p->value.size(), 0.0f);
    }
    next += p->value.size();
  }
  for (layers::parameter* p : all) *next++ = p->has_gradient ? 1.0f : 0.0f;
  finish_copies(all);
}

void stage_device::set_gradient_values(const std::vector<float>& values) {
  TROUPE_CHECK(static_cast<int64_t>(values.size()) == gradient_value_count());
  const std::vector<layers::parameter*> all = parameters();
  size_t offset = 0;
  const size_t flags = values.size() - all.size();
  for (size_t i = 0; i < all.size(); ++i) {
    layers::parameter& p = *all[i];
    const bool touched = values[flags + i] > 0;
    if (touched)
      p.gradient.copy_from_host(p.gradient.device().default_stream(), values.data() + offset);
    p.has_gradient = touched;
    offset += static_cast<size_t>(p.value.size());
  }
  finish_copies(all);
}

int64_t stage_device::gradient_value_count() {
  int64_t count = 0;
  for (layers::parameter* p : parameters()) count += p->value.size() + 1;
  return count;
}

void stage_device::read_weight_values(std::vector<float>* values) {
  const std::vector<layers::parameter*> all = parameters();
  values->resize(static_cast<size_t>(weight_value_count()));
  float* next = values->data();
  for (layers::parameter* p : all) {
    copy_out(p->value, next);
    next += p->value.size();
  }
  finish_copies(all);
}

void stage_device::set_weight_values(const std::vector<float>& values) {
  TROUPE_CHECK(static_cast<int64_t>(values.size()) == weight_value_count());
  const std::vector<layers::parameter*> all = parameters();
  size_t offset = 0;
  for (layers::parameter* p : all) {
    p->value.copy_from_host(p->value.device().default_stream(), values.data() + offset);
    offset += static_cast<size_t>(p->value.size());
  }
  finish_copies(all);
}

void stage_device::sum_gradients_in_group(layers::device_group& group) {
  const std::vector<layers::parameter*> all = parameters();
  if (all.empty()) return;
  layers::backend& device = all.front()->value.device();
  const layers::stream s = device.default_stream();
  std::vector<float> touched(all.size());
  std::vector<layers::device_span> buffers;
  for (size_t i = 0; i < all.size(); ++i) {
    layers::parameter& p = *all[i];
    touched[i] = p.has_gradient ? 1.0f : 0.0f;
    // Accumulation overwrites an untouched gradient, so its memory may hold an old one.
    if (!p.has_gradient) device.fill(s, p.gradient.data(), 0.0f, p.value.size());
    buffers.push_back({p.gradient.data(), static_cast<size_t>(p.value.size())});
  }
  // The flags ride along: a parameter that any replica touched steps.
  layers::tensor flags = layers::tensor::from_host(
      device, s, layers::shape{static_cast<int64_t>(all.size())}, touched);
  buffers.push_back({flags.data(), all.size()});
  group.all_reduce_sum(s, buffers);
  touched = flags.to_host(s);
  for (size_t i = 0; i < all.size(); ++i) all[i]->has_gradient = touched[i] > 0;
}

void stage_device::average_weights_in_group(layers::device_group& group) {
  const std::vector<layers::parameter*> all = parameters();
  if (all.empty()) return;
  layers::backend& device = all.front()->value.device();
  const layers::stream s = device.default_stream();
  std::vector<layers::device_span> buffers;
  for (layers::parameter* p : all) {
    buffers.push_back({p->value.data(), static_cast<size_t>(p->value.size())});
  }
  group.all_reduce_sum(s, buffers);
  const float share = 1.0f / static_cast<float>(group.ranks());
  for (const layers::device_span& weights : buffers) {
    device.axpy(s, share - 1.0f, weights.data, weights.data, weights.count);
  }
  finish_copies(all);
}

int64_t stage_device::weight_value_count() {
  int64_t count = 0;
  for (layers::parameter* p : parameters()) count += p->value.size();
  return count;
}

}  // namespace troupe::actors
