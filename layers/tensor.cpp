#include "layers/tensor.h"

#include <utility>

#include "layers/check.h"

namespace troupe::layers {

int64_t element_count(const shape& dims) {
  int64_t count = 1;
  for (int64_t d : dims) count *= d;
  return count;
}

std::string to_string(const shape& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(dims[i]);
  }
  return text + "]";
}

device_buffer::device_buffer(backend& device, size_t bytes)
    : device_(&device), data_(device.allocate(bytes == 0 ? 4 : bytes)), bytes_(bytes) {
  device.count_bytes(static_cast<int64_t>(bytes));
}

device_buffer::~device_buffer() {
  device_->deallocate(data_);
  device_->count_bytes(-static_cast<int64_t>(bytes_));
}

tensor::tensor(backend& device, shape dims)
    : buffer_(std::make_shared<device_buffer>(device, element_count(dims) * sizeof(float))),
      dims_(std::move(dims)) {
  for (int64_t d : dims_) TROUPE_CHECK(d >= 0);
}

tensor tensor::filled(backend& device, stream s, shape dims, float value) {
  tensor result(device, std::move(dims));
  device.fill(s, result.data(), value, result.size());
  return result;
}

tensor tensor::from_host(backend& device, stream s, shape dims, const std::vector<float>& values) {
  tensor result(device, std::move(dims));
  TROUPE_CHECK(static_cast<int64_t>(values.size()) == result.size());
  result.copy_from_host(s, values.data());
  device.synchronize(s);
  return result;
}

tensor tensor::reshaped(shape dims) const {
  TROUPE_CHECK(element_count(dims) == size());
  tensor result = *this;
  result.dims_ = std::move(dims);
  return result;
}

tensor tensor::clone(stream s) const {
  tensor result(device(), dims_);
  device().copy_device_to_device(s, result.data(), data(), size() * sizeof(float));
  return result;
}

std::vector<float> tensor::to_host(stream s) const {
  std::vector<float> values(size());
  if (values.empty()) return values;
  device().synchronize(s);
  device().copy_device_to_host(s, values.data(), data(), values.size() * sizeof(float));
  device().synchronize(s);
  return values;
}

void tensor::copy_from_host(stream s, const float* values) {
  device().copy_host_to_device(s, data(), values, size() * sizeof(float));
}

int_tensor::int_tensor(backend& device, int64_t count)
    : buffer_(std::make_shared<device_buffer>(device, count * sizeof(int32_t))), count_(count) {}

void int_tensor::copy_from_host(stream s, const int32_t* values) {
  buffer_->device().copy_host_to_device(s, data(), values, count_ * sizeof(int32_t));
}

std::vector<int32_t> int_tensor::to_host(stream s) const {
  std::vector<int32_t> values(count_);
  if (values.empty()) return values;
  backend& device = buffer_->device();
  device.synchronize(s);
  device.copy_device_to_host(s, values.data(), data(), count_ * sizeof(int32_t));
  device.synchronize(s);
  return values;
}

}  // namespace troupe::layers
