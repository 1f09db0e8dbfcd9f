#pragma once

// Private to layers/cuda/: the launchers of the CUDA backend's kernels and its error checks.
// Every launcher enqueues its work on the given stream and returns at once; arguments have
// been validated by cuda_backend, so launchers only check that the launch itself succeeded.
// Reductions are deterministic: each one adds in an order fixed by its sizes alone (never by
// the device, the timing or atomics), so a rerun gives the same bits on any GPU.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "layers/backend.h"

/// Aborts with file:line and CUDA's name and description of the error unless `expression`
/// returns cudaSuccess.
#define TROUPE_CUDA_CHECK(expression)                                                            \
  do {                                                                                           \
    cudaError_t troupe_cuda_status = (expression);                                               \
    if (troupe_cuda_status != cudaSuccess) {                                                     \
      std::fprintf(stderr, "%s:%d: CUDA error %s (%s) in %s\n", __FILE__, __LINE__,              \
                   cudaGetErrorName(troupe_cuda_status), cudaGetErrorString(troupe_cuda_status), \
                   #expression);                                                                 \
      std::abort();                                                                              \
    }                                                                                            \
  } while (false)

/// Aborts with file:line and cuBLAS's description of the error unless `expression` returns
/// CUBLAS_STATUS_SUCCESS.
#define TROUPE_CUBLAS_CHECK(expression)                                          \
  do {                                                                           \
    cublasStatus_t troupe_cublas_status = (expression);                          \
    if (troupe_cublas_status != CUBLAS_STATUS_SUCCESS) {                         \
      std::fprintf(stderr, "%s:%d: cuBLAS error %s in %s\n", __FILE__, __LINE__, \
                   cublasGetStatusString(troupe_cublas_status), #expression);    \
      std::abort();                                                              \
    }                                                                            \
  } while (false)

namespace troupe::layers {

inline cublasOperation_t to_cublas(transpose t) {
  return t == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/// `bytes` from `pool`, usable on `s` in stream order; aborts naming cuda:`device` and
/// `purpose` when the device is out of memory (cuda_memory.cu).
void* allocate_on_stream(int device, cudaMemPool_t pool, cudaStream_t s, size_t bytes,
                         const char* purpose);

}  // namespace troupe::layers

namespace troupe::layers::cuda_kernels {

void fill(cudaStream_t s, float* data, float value, size_t count);
/// matrix[r][c] *= beta for a rows×cols block with row stride ld (zero when beta == 0, without
/// reading): what a GEMM with an empty inner dimension leaves in C.
void scale_matrix(cudaStream_t s, float* matrix, int rows, int cols, int ld, float beta);

void add_row_vector(cudaStream_t s, float* matrix, const float* vector, int rows, int cols);
void sum_rows(cudaStream_t s, const float* matrix, int rows, int cols, float beta, float* out);
void add_channel_vector(cudaStream_t s, float* data, const float* vector, int batch, int channels,
                        int spatial);
void sum_channels(cudaStream_t s, const float* data, int batch, int channels, int spatial,
                  float beta, float* out);
void transpose_batched(cudaStream_t s, const float* in, float* out, int batch, int rows, int cols);
void axpy(cudaStream_t s, float alpha, const float* x, float* y, size_t count);
void multiply(cudaStream_t s, const float* a, const float* b, float* out, size_t count);

/// Number of floats of scratch that sum() needs for `count` inputs (0: none).
size_t sum_scratch_count(size_t count);
/// out[0] = sum of x; `scratch` holds sum_scratch_count(count) floats (may be null when 0).
void sum(cudaStream_t s, const float* x, size_t count, float* out, float* scratch);

void activation_forward(cudaStream_t s, activation f, const float* x, float* y, size_t count);
void activation_backward(cudaStream_t s, activation f, const float* x, const float* y,
                         const float* dy, float* dx, size_t count);

/// Number of floats of scratch that softmax_cross_entropy() needs for `rows` rows.
size_t softmax_cross_entropy_scratch_count(int rows);
void softmax_cross_entropy(cudaStream_t s, const float* logits, const int32_t* labels, int rows,
                           int cols, float gradient_scale, float* gradient, float* loss_sum,
                           float* correct, float* scratch);

void im2col(cudaStream_t s, const convolution_geometry& g, const float* image, float* columns);
void col2im(cudaStream_t s, const convolution_geometry& g, const float* columns, float* image);
void max_pool_forward(cudaStream_t s, const pooling_geometry& g, const float* x, float* y,
                      int32_t* argmax);
void max_pool_backward(cudaStream_t s, const pooling_geometry& g, const float* dy,
                       const int32_t* argmax, float* dx);

/// `scale` is 1 / (1 - probability) (0 when probability is 1), computed on the host as the CPU
/// backend computes it, so masks agree bit for bit.
void dropout_forward(cudaStream_t s, const float* x, float* y, float* mask, size_t count,
                     float probability, float scale, uint64_t seed, uint64_t offset);

void sgd_step(cudaStream_t s, float* weights, const float* gradient, float* velocity, size_t count,
              const sgd_parameters& p);
/// The step sizes come from step_sizes_of(p), computed in double on the host as the CPU
/// backend does.
void adam_step(cudaStream_t s, float* weights, const float* gradient, float* first_moment,
               float* second_moment, size_t count, const adam_parameters& p);

// ---- transformer kernels (cuda_transformer_kernels.cu) ----------------------------------------
void layer_norm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta,
                        float* y, float* normalized, float* rstd, int rows, int cols,
                        float epsilon);
void layer_norm_backward(cudaStream_t s, const float* dy, const float* gamma,
                         const float* normalized, const float* rstd, float* dx, int rows, int cols);
void causal_softmax_forward(cudaStream_t s, const float* scores, float* probabilities, int batch,
                            int t, float scale);
void softmax_backward(cudaStream_t s, const float* probabilities, const float* dp, float* dscores,
                      int rows, int cols, float scale);
void embedding_forward(cudaStream_t s, const float* ids, const float* table, float* out, int count,
                       int dim, int vocab);
void embedding_backward(cudaStream_t s, const float* ids, const float* dout, float* table_gradient,
                        int count, int dim, int vocab, float beta);

// ---- recurrent-cell kernels (cuda_recurrent_kernels.cu) ----------------------------------------
void lstm_cell_forward(cudaStream_t s, const lstm_cell_geometry& g, float* gates,
                       const float* input, float* output);
void lstm_cell_backward(cudaStream_t s, const lstm_cell_geometry& g, const float* gates,
                        const float* input, const float* output, const float* output_gradient,
                        float* gate_gradient, float* input_gradient);

}  // namespace troupe::layers::cuda_kernels
