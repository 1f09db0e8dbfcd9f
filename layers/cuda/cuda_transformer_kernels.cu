// The CUDA backend's transformer kernels: layer normalization, causal softmax and embeddings.
// Row operations give each row to one warp, whose lanes stride the row and combine their
// partial sums with a butterfly, so every sum is added in an order fixed by the sizes alone.
// The embedding gradient gives each vocabulary row to one block that walks the tokens in
// order: no atomics, so reruns agree bit for bit.

#include <algorithm>
#include <cmath>

#include "layers/cuda/cuda_elementwise.cuh"
#include "layers/cuda/cuda_kernels.cuh"

namespace troupe::layers::cuda_kernels {
namespace {

constexpr int rows_per_block = block_threads / warp_size;  // one warp per row

__device__ float warp_largest(float value) {
  for (int offset = warp_size / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(full_warp, value, offset));
  }
  return value;
}

/// The row this warp owns (may be past the last row: the warp then does nothing).
__device__ int warp_row() {
  return static_cast<int>(blockIdx.x) * rows_per_block + static_cast<int>(threadIdx.x) / warp_size;
}

__device__ int lane() { return static_cast<int>(threadIdx.x) % warp_size; }

unsigned row_blocks(int rows) {
  return static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
}

__global__ void layer_norm_forward_kernel(const float* x, const float* gamma, const float* beta,
                                          float* y, float* normalized, float* rstd, int rows,
                                          int cols, float epsilon) {
  const int row = warp_row();
  if (row >= rows) return;
  const float* in = x + static_cast<int64_t>(row) * cols;
  float sum = 0;
  for (int c = lane(); c < cols; c += warp_size) sum += in[c];
  const float mean = warp_sum(sum) / static_cast<float>(cols);
  float squares = 0;
  for (int c = lane(); c < cols; c += warp_size) {
    const float d = in[c] - mean;
    squares += d * d;
  }
  const float inverse = rsqrtf(warp_sum(squares) / static_cast<float>(cols) + epsilon);
  if (lane() == 0) rstd[row] = inverse;
  float* out = y + static_cast<int64_t>(row) * cols;
  float* hat = normalized + static_cast<int64_t>(row) * cols;
  for (int c = lane(); c < cols; c += warp_size) {
    const float h = (in[c] - mean) * inverse;
    hat[c] = h;
    out[c] = h * gamma[c] + beta[c];
  }
}

__global__ void layer_norm_backward_kernel(const float* dy, const float* gamma,
                                           const float* normalized, const float* rstd, float* dx,
                                           int rows, int cols) {
  const int row = warp_row();
  if (row >= rows) return;
  const float* grad = dy + static_cast<int64_t>(row) * cols;
  const float* hat = normalized + static_cast<int64_t>(row) * cols;
  float sum = 0, dot = 0;
  for (int c = lane(); c < cols; c += warp_size) {
    const float g = grad[c] * gamma[c];
    sum += g;
    dot += g * hat[c];
  }
  const float mean = warp_sum(sum) / static_cast<float>(cols);
  const float mean_dot = warp_sum(dot) / static_cast<float>(cols);
  float* out = dx + static_cast<int64_t>(row) * cols;
  for (int c = lane(); c < cols; c += warp_size) {
    out[c] = rstd[row] * (grad[c] * gamma[c] - mean - hat[c] * mean_dot);
  }
}

__global__ void causal_softmax_kernel(const float* scores, float* probabilities, int rows, int t,
                                      float scale) {
  const int row = warp_row();
  if (row >= rows) return;
  const int visible = row % t + 1;
  const float* in = scores + static_cast<int64_t>(row) * t;
  float* out = probabilities + static_cast<int64_t>(row) * t;
  float largest = -INFINITY;
  for (int j = lane(); j < visible; j += warp_size) largest = fmaxf(largest, in[j] * scale);
  largest = warp_largest(largest);
  float total = 0;
  for (int j = lane(); j < visible; j += warp_size) {
    const float e = expf(in[j] * scale - largest);
    out[j] = e;
    total += e;
  }
  const float inverse = 1.0f / warp_sum(total);
  for (int j = lane(); j < t; j += warp_size) out[j] = j < visible ? out[j] * inverse : 0.0f;
}

__global__ void softmax_backward_kernel(const float* probabilities, const float* dp, float* dscores,
                                        int rows, int cols, float scale) {
  const int row = warp_row();
  if (row >= rows) return;
  const float* p = probabilities + static_cast<int64_t>(row) * cols;
  const float* grad = dp + static_cast<int64_t>(row) * cols;
  float dot = 0;
  for (int j = lane(); j < cols; j += warp_size) dot += grad[j] * p[j];
  dot = warp_sum(dot);
  float* out = dscores + static_cast<int64_t>(row) * cols;
  for (int j = lane(); j < cols; j += warp_size) out[j] = scale * p[j] * (grad[j] - dot);
}

__device__ int64_t row_of(float id, int vocab) {
  if (!(id >= 0.0f && id < static_cast<float>(vocab))) return -1;
  return static_cast<int64_t>(id);
}

__global__ void embedding_forward_kernel(const float* ids, const float* table, float* out,
                                         int count, int dim, int vocab) {
  const int64_t total = static_cast<int64_t>(count) * dim;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = row_of(ids[i / dim], vocab);
    out[i] = row < 0 ? 0.0f : table[row * dim + i % dim];
  }
}

/// One block per vocabulary row; each thread owns columns of it and adds the matching tokens'
/// gradients in token order.
__global__ void embedding_backward_kernel(const float* ids, const float* dout,
                                          float* table_gradient, int count, int dim, int vocab,
                                          float beta) {
  const int v = static_cast<int>(blockIdx.x);
  for (int c = static_cast<int>(threadIdx.x); c < dim; c += static_cast<int>(blockDim.x)) {
    float total = 0;
    for (int i = 0; i < count; ++i) {
      if (row_of(ids[i], vocab) == v) total += dout[static_cast<int64_t>(i) * dim + c];
    }
    float* target = table_gradient + static_cast<int64_t>(v) * dim + c;
    *target = beta == 0.0f ? total : beta * *target + total;
  }
}

}  // namespace

void layer_norm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta,
                        float* y, float* normalized, float* rstd, int rows, int cols,
                        float epsilon) {
  if (rows == 0) return;
  layer_norm_forward_kernel<<<row_blocks(rows), block_threads, 0, s>>>(
      x, gamma, beta, y, normalized, rstd, rows, cols, epsilon);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

void layer_norm_backward(cudaStream_t s, const float* dy, const float* gamma,
                         const float* normalized, const float* rstd, float* dx, int rows,
                         int cols) {
  if (rows == 0) return;
  layer_norm_backward_kernel<<<row_blocks(rows), block_threads, 0, s>>>(dy, gamma, normalized, rstd,
                                                                        dx, rows, cols);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

void causal_softmax_forward(cudaStream_t s, const float* scores, float* probabilities, int batch,
                            int t, float scale) {
  const int rows = batch * t;
  if (rows == 0) return;
  causal_softmax_kernel<<<row_blocks(rows), block_threads, 0, s>>>(scores, probabilities, rows, t,
                                                                   scale);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

void softmax_backward(cudaStream_t s, const float* probabilities, const float* dp, float* dscores,
                      int rows, int cols, float scale) {
  if (rows == 0) return;
  softmax_backward_kernel<<<row_blocks(rows), block_threads, 0, s>>>(probabilities, dp, dscores,
                                                                     rows, cols, scale);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

void embedding_forward(cudaStream_t s, const float* ids, const float* table, float* out, int count,
                       int dim, int vocab) {
  const int64_t total = static_cast<int64_t>(count) * dim;
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, 65535);
  embedding_forward_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(ids, table, out, count,
                                                                         dim, vocab);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

void embedding_backward(cudaStream_t s, const float* ids, const float* dout, float* table_gradient,
                        int count, int dim, int vocab, float beta) {
  if (vocab == 0 || dim == 0) return;
  embedding_backward_kernel<<<static_cast<unsigned>(vocab), 128, 0, s>>>(ids, dout, table_gradient,
                                                                         count, dim, vocab, beta);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace troupe::layers::cuda_kernels
