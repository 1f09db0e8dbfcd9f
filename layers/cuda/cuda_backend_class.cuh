#pragma once

// Private to layers/cuda/: the class of the CUDA + cuBLAS backend, defined in cuda_backend.cu
// and cuda_memory.cu. Streams and events are cudaStream_t / cudaEvent_t cast to void*.
// Device memory comes from two stream-ordered pools owned by the backend: one for allocate()
// (allocated and freed on a private stream that carries no work, so a block is reused only
// after the caller has freed it, as the interface requires; freed blocks are kept by size and
// handed out again without a driver call, since a training step allocates the same shapes
// every time) and one for the short-lived scratch of reductions and GEMM operands (allocated
// and freed on the stream of the operation that uses it).
// GEMM goes through cuBLASLt (cuda_gemm.cuh: one algorithm per shape, chosen by timing on
// first use) with a workspace per stream, so concurrent stages never share one; batched GEMMs
// use one cuBLAS handle per stream for the same reason. The GEMM precision is kept per stream
// beside its handle: fp32 computes in plain fp32; tf32 uses the FAST_TF32 compute type on fp32
// operands; bf16 multiplies bfloat16 copies of the operands (or uses FAST_16BF where the
// search finds that faster); products are summed in fp32.
//
// Threads: CAF runs a stage's handlers on any scheduler thread, so every operation makes the
// backend's device current (activate() or enter()) before its first CUDA or cuBLAS call.
//
// Pinned host memory (allocate_host) is kept for reuse once returned: cudaHostAlloc costs
// milliseconds and cudaFreeHost synchronizes the whole device, neither of which a message may
// pay. Blocks come in power-of-two sizes, so a stage that sends activations of one shape
// keeps taking back the same few blocks; they are freed when the backend goes.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "layers/backend.h"
#include "layers/block_cache.h"
#include "layers/check.h"
#include "layers/cuda/cuda_gemm.cuh"
#include "layers/cuda/cuda_kernels.cuh"

namespace troupe::layers {

inline cudaStream_t to_cuda(stream s) { return static_cast<cudaStream_t>(s.handle); }
inline cudaEvent_t to_cuda(event e) { return static_cast<cudaEvent_t>(e.handle); }

class cuda_backend final : public backend {
 public:
  /// The backend on `device`, or null (with the reason on stderr) when it cannot be opened.
  static std::unique_ptr<backend> open(int device);
  ~cuda_backend() override;

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  device_kind kind() const override { return device_kind::cuda; }

  void* allocate(size_t bytes) override;
  void deallocate(void* pointer) override;
  void copy_host_to_device(stream s, void* device, const void* host, size_t bytes) override;
  void copy_device_to_host(stream s, void* host, const void* device, size_t bytes) override;
  void copy_device_to_device(stream s, void* target, const void* source, size_t bytes) override;
  void fill(stream s, float* data, float value, size_t count) override;
  void* allocate_host(size_t bytes) override;
  void deallocate_host(void* pointer) override;

  stream default_stream() override { return stream{default_stream_}; }
  stream create_stream() override;
  void destroy_stream(stream s) override;
  void synchronize(stream s) override;
  event create_event() override;
  void destroy_event(event e) override;
  void record_event(event e, stream s) override;
  void wait_event(stream s, event e) override;
  void synchronize_event(event e) override;
  void set_gemm_precision(stream s, math_precision precision) override;

  void gemm(stream s, transpose transpose_a, transpose transpose_b, int m, int n, int k,
            float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c,
            int ldc) override;
  void add_row_vector(stream s, float* matrix, const float* vector, int rows, int cols) override;
  void sum_rows(stream s, const float* matrix, int rows, int cols, float beta, float* out) override;
  void add_channel_vector(stream s, float* data, const float* vector, int batch, int channels,
                          int spatial) override;
  void sum_channels(stream s, const float* data, int batch, int channels, int spatial, float beta,
                    float* out) override;
  void transpose_batched(stream s, const float* in, float* out, int batch, int rows,
                         int cols) override;
  void copy_matrix(stream s, const float* source, int source_stride, float* target,
                   int target_stride, int rows, int cols) override;
  void axpy(stream s, float alpha, const float* x, float* y, size_t count) override;
  void multiply(stream s, const float* a, const float* b, float* out, size_t count) override;
  void sum(stream s, const float* x, size_t count, float* out) override;

  void gemm_batched(stream s, transpose transpose_a, transpose transpose_b, int m, int n, int k,
                    float alpha, const float* a, int lda, int64_t stride_a, const float* b, int ldb,
                    int64_t stride_b, float beta, float* c, int ldc, int64_t stride_c,
                    int batch) override;
  void layer_norm_forward(stream s, const float* x, const float* gamma, const float* beta, float* y,
                          float* normalized, float* rstd, int rows, int cols,
                          float epsilon) override {
    cuda_kernels::layer_norm_forward(enter(s), x, gamma, beta, y, normalized, rstd, rows, cols,
                                     epsilon);
  }
  void layer_norm_backward(stream s, const float* dy, const float* gamma, const float* normalized,
                           const float* rstd, float* dx, int rows, int cols) override {
    cuda_kernels::layer_norm_backward(enter(s), dy, gamma, normalized, rstd, dx, rows, cols);
  }
  void causal_softmax_forward(stream s, const float* scores, float* probabilities, int batch, int t,
                              float scale) override {
    cuda_kernels::causal_softmax_forward(enter(s), scores, probabilities, batch, t, scale);
  }
  void softmax_backward(stream s, const float* probabilities, const float* dp, float* dscores,
                        int rows, int cols, float scale) override {
    cuda_kernels::softmax_backward(enter(s), probabilities, dp, dscores, rows, cols, scale);
  }
  void lstm_cell_forward(stream s, const lstm_cell_geometry& g, float* gates, const float* input,
                         float* output) override {
    cuda_kernels::lstm_cell_forward(enter(s), g, gates, input, output);
  }
  void lstm_cell_backward(stream s, const lstm_cell_geometry& g, const float* gates,
                          const float* input, const float* output, const float* output_gradient,
                          float* gate_gradient, float* input_gradient) override {
    cuda_kernels::lstm_cell_backward(enter(s), g, gates, input, output, output_gradient,
                                     gate_gradient, input_gradient);
  }
  void embedding_forward(stream s, const float* ids, const float* table, float* out, int count,
                         int dim, int vocab) override {
    cuda_kernels::embedding_forward(enter(s), ids, table, out, count, dim, vocab);
  }
  void embedding_backward(stream s, const float* ids, const float* dout, float* table_gradient,
                          int count, int dim, int vocab, float beta) override {
    cuda_kernels::embedding_backward(enter(s), ids, dout, table_gradient, count, dim, vocab, beta);
  }

  void activation_forward(stream s, activation f, const float* x, float* y, size_t count) override;
  void activation_backward(stream s, activation f, const float* x, const float* y, const float* dy,
                           float* dx, size_t count) override;
  void softmax_cross_entropy(stream s, const float* logits, const int32_t* labels, int rows,
                             int cols, float gradient_scale, float* gradient, float* loss_sum,
                             float* correct) override;

  void im2col(stream s, const convolution_geometry& g, const float* image, float* columns) override;
  void col2im(stream s, const convolution_geometry& g, const float* columns, float* image) override;
  void max_pool_forward(stream s, const pooling_geometry& g, const float* x, float* y,
                        int32_t* argmax) override;
  void max_pool_backward(stream s, const pooling_geometry& g, const float* dy,
                         const int32_t* argmax, float* dx) override;

  void dropout_forward(stream s, const float* x, float* y, float* mask, size_t count,
                       float probability, uint64_t seed, uint64_t offset) override;

  void sgd_step(stream s, float* weights, const float* gradient, float* velocity, size_t count,
                const sgd_parameters& p) override;
  void adam_step(stream s, float* weights, const float* gradient, float* first_moment,
                 float* second_moment, size_t count, const adam_parameters& p) override;

 private:
  explicit cuda_backend(int device) : device_(device) {}
  bool initialize();

  /// Makes this backend's device current on the calling thread.
  void activate() const { TROUPE_CUDA_CHECK(cudaSetDevice(device_)); }
  /// activate(), then the CUDA stream of `s` (the default stream for a null handle).
  cudaStream_t enter(stream s) const {
    activate();
    return s.handle != nullptr ? to_cuda(s) : default_stream_;
  }
  /// What GEMMs on one stream use: its cuBLAS handle, cuBLASLt workspace and precision.
  struct stream_blas {
    cublasHandle_t handle = nullptr;
    void* workspace = nullptr;  // cuda_gemm::workspace_bytes
    math_precision precision = math_precision::fp32;
  };
  /// The entry of `s`, its handle created on first use; the caller holds blas_mutex_.
  stream_blas& blas_entry(cudaStream_t s);
  /// A copy of the entry of `s` (handle and precision), created on first use.
  stream_blas blas_for(cudaStream_t s);
  /// `count` floats of scratch usable on `s` until free_scratch(s, ...) (null when 0).
  float* allocate_scratch(cudaStream_t s, size_t count);
  /// Returns the freed blocks that allocate() keeps for reuse to the memory pool.
  void release_free_blocks();
  void free_scratch(cudaStream_t s, float* scratch);

  int device_;
  cudaStream_t default_stream_ = nullptr;
  cudaStream_t allocation_stream_ = nullptr;  // orders allocate() and deallocate(); no work
  cudaMemPool_t memory_pool_ = nullptr;
  cudaMemPool_t scratch_pool_ = nullptr;
  std::mutex blas_mutex_;  // guards blas_: stages call from their own threads
  std::unordered_map<cudaStream_t, stream_blas> blas_;
  std::unique_ptr<cuda_gemm::gemm_runner> gemm_runner_;
  block_cache device_blocks_;  // tensors are freed from any thread
  block_cache host_blocks_;    // frames return pinned blocks from any thread
};

}  // namespace troupe::layers
