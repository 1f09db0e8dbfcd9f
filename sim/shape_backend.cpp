#include "sim/shape_backend.h"

#include <cstdlib>

#include "layers/check.h"

namespace troupe::sim {
namespace {

using namespace layers;

class shapes_only final : public backend {
 public:
  std::string name() const override { return "shapes"; }
  // Reports itself as a CPU so that code choosing host paths does not try device copies.
  device_kind kind() const override { return device_kind::cpu; }

  void* allocate(size_t) override { return dummy_; }
  void deallocate(void*) override {}
  void copy_host_to_device(stream, void*, const void*, size_t) override {}
  void copy_device_to_host(stream, void*, const void*, size_t) override {}
  void copy_device_to_device(stream, void*, const void*, size_t) override {}
  void fill(stream, float*, float, size_t) override {}
  void* allocate_host(size_t bytes) override {
    void* pointer = std::aligned_alloc(64, (bytes + 64) / 64 * 64);
    TROUPE_CHECK(pointer != nullptr);
    return pointer;
  }
  void deallocate_host(void* pointer) override { std::free(pointer); }

  stream default_stream() override { return {}; }
  stream create_stream() override { return {}; }
  void destroy_stream(stream) override {}
  void synchronize(stream) override {}
  event create_event() override { return {}; }
  void destroy_event(event) override {}
  void record_event(event, stream) override {}
  void wait_event(stream, event) override {}
  void synchronize_event(event) override {}
  void set_gemm_precision(stream, math_precision) override {}

  void gemm(stream, transpose, transpose, int, int, int, float, const float*, int, const float*,
            int, float, float*, int) override {}
  void add_row_vector(stream, float*, const float*, int, int) override {}
  void sum_rows(stream, const float*, int, int, float, float*) override {}
  void add_channel_vector(stream, float*, const float*, int, int, int) override {}
  void sum_channels(stream, const float*, int, int, int, float, float*) override {}
  void transpose_batched(stream, const float*, float*, int, int, int) override {}
  void copy_matrix(stream, const float*, int, float*, int, int, int) override {}
  void axpy(stream, float, const float*, float*, size_t) override {}
  void multiply(stream, const float*, const float*, float*, size_t) override {}
  void sum(stream, const float*, size_t, float*) override {}
  void gemm_batched(stream, transpose, transpose, int, int, int, float, const float*, int, int64_t,
                    const float*, int, int64_t, float, float*, int, int64_t, int) override {}
  void layer_norm_forward(stream, const float*, const float*, const float*, float*, float*, float*,
                          int, int, float) override {}
  void layer_norm_backward(stream, const float*, const float*, const float*, const float*, float*,
                           int, int) override {}
  void causal_softmax_forward(stream, const float*, float*, int, int, float) override {}
  void softmax_backward(stream, const float*, const float*, float*, int, int, float) override {}
  void lstm_cell_forward(stream, const lstm_cell_geometry&, float*, const float*, float*) override {
  }
  void lstm_cell_backward(stream, const lstm_cell_geometry&, const float*, const float*,
                          const float*, const float*, float*, float*) override {}
  void embedding_forward(stream, const float*, const float*, float*, int, int, int) override {}
  void embedding_backward(stream, const float*, const float*, float*, int, int, int,
                          float) override {}
  void activation_forward(stream, activation, const float*, float*, size_t) override {}
  void activation_backward(stream, activation, const float*, const float*, const float*, float*,
                           size_t) override {}
  void softmax_cross_entropy(stream, const float*, const int32_t*, int, int, float, float*, float*,
                             float*) override {}
  void im2col(stream, const convolution_geometry&, const float*, float*) override {}
  void col2im(stream, const convolution_geometry&, const float*, float*) override {}
  void max_pool_forward(stream, const pooling_geometry&, const float*, float*, int32_t*) override {}
  void max_pool_backward(stream, const pooling_geometry&, const float*, const int32_t*,
                         float*) override {}
  void dropout_forward(stream, const float*, float*, float*, size_t, float, uint64_t,
                       uint64_t) override {}
  void sgd_step(stream, float*, const float*, float*, size_t, const sgd_parameters&) override {}
  void adam_step(stream, float*, const float*, float*, float*, size_t,
                 const adam_parameters&) override {}

 private:
  alignas(64) unsigned char dummy_block_[64] = {};
  void* dummy_ = dummy_block_;
};

}  // namespace

backend& shape_backend() {
  static shapes_only instance;
  return instance;
}

}  // namespace troupe::sim
