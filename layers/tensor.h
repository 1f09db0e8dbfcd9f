#pragma once

// A float32 tensor: a shape and contiguous row-major data in one backend's device memory.
// Copies are shallow (they share the buffer, like PyTorch tensors); clone() copies the data.
// The first dimension is the batch by convention: rows() is dims[0], row_size() the rest.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers/backend.h"

namespace troupe::layers {

using shape = std::vector<int64_t>;

/// Number of elements of a shape (1 for the empty shape).
int64_t element_count(const shape& dims);

/// "[64, 1, 28, 28]".
std::string to_string(const shape& dims);

/// Device memory owned by one backend, freed when the last reference goes.
class device_buffer {
 public:
  device_buffer(backend& device, size_t bytes);
  ~device_buffer();
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  backend& device() const { return *device_; }

 private:
  backend* device_;
  void* data_;
  size_t bytes_;
};

class tensor {
 public:
  /// An empty tensor that owns nothing.
  tensor() = default;
  /// Uninitialized storage for `dims` on `device`.
  tensor(backend& device, shape dims);

  /// A tensor of `dims` filled with `value`, enqueued on `s`.
  static tensor filled(backend& device, stream s, shape dims, float value);
  /// A tensor holding a copy of `values` (element_count(dims) of them); synchronous.
  static tensor from_host(backend& device, stream s, shape dims, const std::vector<float>& values);

  bool empty() const { return buffer_ == nullptr; }
  const shape& dims() const { return dims_; }
  int64_t size() const { return element_count(dims_); }
  int64_t rows() const { return dims_.empty() ? 1 : dims_[0]; }
  int64_t row_size() const { return rows() == 0 ? 0 : size() / rows(); }
  float* data() const { return static_cast<float*>(buffer_->data()); }
  backend& device() const { return buffer_->device(); }
  /// The buffer's owner, to keep the data alive while something else (a send) reads it.
  std::shared_ptr<const void> storage() const { return buffer_; }

  /// The same data seen with another shape of equal element count (aborts otherwise).
  tensor reshaped(shape dims) const;
  /// A new buffer with a copy of this tensor's data, enqueued on `s`.
  tensor clone(stream s) const;
  /// Copies the data to the host; synchronizes `s` first and after.
  std::vector<float> to_host(stream s) const;
  /// Copies element_count(dims) floats from the host; enqueued on `s` (the source must stay
  /// alive until `s` is synchronized).
  void copy_from_host(stream s, const float* values);

 private:
  std::shared_ptr<device_buffer> buffer_;
  shape dims_;
};

/// Device memory holding int32 values (class labels, pooling indices).
class int_tensor {
 public:
  int_tensor() = default;
  int_tensor(backend& device, int64_t count);

  bool empty() const { return buffer_ == nullptr; }
  int64_t size() const { return count_; }
  int32_t* data() const { return static_cast<int32_t*>(buffer_->data()); }
  void copy_from_host(stream s, const int32_t* values);
  std::vector<int32_t> to_host(stream s) const;

 private:
  std::shared_ptr<device_buffer> buffer_;
  int64_t count_ = 0;
};

}  // namespace troupe::layers
