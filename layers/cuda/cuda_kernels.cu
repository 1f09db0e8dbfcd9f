// The CUDA backend's kernels. Element-wise work goes through the grid-stride launcher and
// functors of cuda_elementwise.cuh; reductions and the transpose have their own kernels here,
// each adding in an order fixed by the sizes alone (no atomics), so reruns agree bit for bit.

#include <algorithm>
#include <climits>
#include <cmath>

#include "layers/cuda/cuda_elementwise.cuh"
#include "layers/cuda/cuda_kernels.cuh"

namespace troupe::layers::cuda_kernels {
namespace {

/// The sum of `value` over a block of block_threads threads, added in a fixed tree order;
/// every thread of the block must call it and receives the total.
__device__ float block_sum(float value) {
  __shared__ float partial[block_threads];
  __syncthreads();  // a previous call may still be reading partial[0]
  partial[threadIdx.x] = value;
  __syncthreads();
  for (int width = block_threads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) partial[threadIdx.x] += partial[threadIdx.x + width];
    __syncthreads();
  }
  return partial[0];
}

/// The largest value with the smallest index among the lanes' (value, index) pairs.
__device__ void warp_argmax(float& value, int& index) {
  for (int offset = warp_size / 2; offset > 0; offset /= 2) {
    const float other_value = __shfl_xor_sync(full_warp, value, offset);
    const int other_index = __shfl_xor_sync(full_warp, index, offset);
    if (other_value > value || (other_value == value && other_index < index)) {
      value = other_value;
      index = other_index;
    }
  }
}

// ---- reduction and layout kernels -----------------------------------------------------------

constexpr int column_tile = 32;
constexpr int row_lanes = 16;

/// One block per 32 columns; lane y of a column adds rows y, y + 16, ..., then lane 0 adds the
/// 16 lane totals in order.
__global__ void sum_rows_kernel(const float* matrix, int rows, int cols, float beta, float* out) {
  __shared__ float partial[row_lanes][column_tile + 1];
  const int column = blockIdx.x * column_tile + threadIdx.x;
  float total = 0.0f;
  if (column < cols) {
    for (int r = threadIdx.y; r < rows; r += row_lanes) {
      total += matrix[static_cast<size_t>(r) * cols + column];
    }
  }
  partial[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y != 0 || column >= cols) return;
  for (int lane = 1; lane < row_lanes; ++lane) total += partial[lane][threadIdx.x];
  out[column] = beta == 0.0f ? total : beta * out[column] + total;
}

/// One block per channel.
__global__ void sum_channels_kernel(const float* data, int batch, int channels, int spatial,
                                    float beta, float* out) {
  const int channel = blockIdx.x;
  const size_t per_channel = static_cast<size_t>(batch) * spatial;
  float total = 0.0f;
  for (size_t j = threadIdx.x; j < per_channel; j += blockDim.x) {
    const size_t n = j / spatial;
    total += data[(n * channels + channel) * spatial + j % spatial];
  }
  total = block_sum(total);
  if (threadIdx.x == 0) out[channel] = beta == 0.0f ? total : beta * out[channel] + total;
}

/// Block b adds elements b*256 + t, stepping by the whole grid, then writes its total to
/// out[b]; the grid size depends only on count, so the order does too.
__global__ void strided_sum_kernel(const float* x, size_t count, float* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  float total = 0.0f;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    total += x[i];
  }
  total = block_sum(total);
  if (threadIdx.x == 0) out[blockIdx.x] = total;
}

constexpr int transpose_tile = 32;
constexpr int transpose_lanes = 8;

__global__ void transpose_kernel(const float* in, float* out, int batch, int rows, int cols) {
  __shared__ float tile[transpose_tile][transpose_tile + 1];
  const int row_tiles = (rows + transpose_tile - 1) / transpose_tile;
  const int column0 = blockIdx.x * transpose_tile;
  for (int b = blockIdx.z; b < batch; b += gridDim.z) {
    const size_t matrix = static_cast<size_t>(b) * rows * cols;
    for (int tile_row = blockIdx.y; tile_row < row_tiles; tile_row += gridDim.y) {
      const int row0 = tile_row * transpose_tile;
      for (int dy = threadIdx.y; dy < transpose_tile; dy += transpose_lanes) {
        const int r = row0 + dy;
        const int c = column0 + threadIdx.x;
        if (r < rows && c < cols)
          tile[dy][threadIdx.x] = in[matrix + static_cast<size_t>(r) * cols + c];
      }
      __syncthreads();
      for (int dy = threadIdx.y; dy < transpose_tile; dy += transpose_lanes) {
        const int c = column0 + dy;
        const int r = row0 + threadIdx.x;
        if (r < rows && c < cols)
          out[matrix + static_cast<size_t>(c) * rows + r] = tile[threadIdx.x][dy];
      }
      __syncthreads();
    }
  }
}

constexpr int rows_per_block = block_threads / warp_size;

/// One warp per row: first maximal logit, log-sum-exp, optional gradient, and the row's loss
/// and hit written to row_loss / row_correct.
__global__ void softmax_cross_entropy_kernel(const float* logits, const int32_t* labels, int rows,
                                             int cols, float gradient_scale, float* gradient,
                                             float* row_loss, float* row_correct) {
  const int row = blockIdx.x * rows_per_block + threadIdx.x / warp_size;
  const int lane = threadIdx.x % warp_size;
  if (row >= rows) return;  // the whole warp leaves together
  const float* x = logits + static_cast<size_t>(row) * cols;
  float best = -INFINITY;
  int best_index = INT_MAX;
  for (int c = lane; c < cols; c += warp_size) {
    if (best_index == INT_MAX || x[c] > best) {
      best = x[c];
      best_index = c;
    }
  }
  warp_argmax(best, best_index);
  float total = 0.0f;
  for (int c = lane; c < cols; c += warp_size) total += expf(x[c] - best);
  total = warp_sum(total);
  const int label = labels[row];
  const bool ignored = label == ignored_label;
  if (gradient != nullptr) {
    float* g = gradient + static_cast<size_t>(row) * cols;
    for (int c = lane; c < cols; c += warp_size) {
      g[c] = ignored ? 0.0f
                     : (expf(x[c] - best) / total - (c == label ? 1.0f : 0.0f)) * gradient_scale;
    }
  }
  if (lane != 0) return;
  const bool valid = label >= 0 && label < cols;
  row_loss[row] = ignored ? 0.0f : valid ? logf(total) - (x[label] - best) : NAN;
  row_correct[row] = valid && best_index == label ? 1.0f : 0.0f;
}

/// A single block adds the rows' losses and hits in a fixed order.
__global__ void row_totals_kernel(const float* row_loss, const float* row_correct, int rows,
                                  float* loss_sum, float* correct) {
  float loss = 0.0f;
  float hits = 0.0f;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    loss += row_loss[r];
    hits += row_correct[r];
  }
  loss = block_sum(loss);
  hits = block_sum(hits);
  if (threadIdx.x == 0) {
    loss_sum[0] = loss;
    correct[0] = hits;
  }
}

constexpr size_t sum_items_per_block = block_threads * 8;
constexpr size_t sum_max_blocks = 1024;

size_t sum_blocks(size_t count) {
  return std::clamp<size_t>((count + sum_items_per_block - 1) / sum_items_per_block, 1,
                            sum_max_blocks);
}

}  // namespace

void fill(cudaStream_t s, float* data, float value, size_t count) {
  for_each(s, count, fill_op{data, value});
}

void scale_matrix(cudaStream_t s, float* matrix, int rows, int cols, int ld, float beta) {
  if (cols == 0) return;
  for_each(s, static_cast<size_t>(rows) * cols, scale_matrix_op{matrix, cols, ld, beta});
}

void add_row_vector(cudaStream_t s, float* matrix, const float* vector, int rows, int cols) {
  for_each(s, static_cast<size_t>(rows) * cols, add_row_vector_op{matrix, vector, cols});
}

void sum_rows(cudaStream_t s, const float* matrix, int rows, int cols, float beta, float* out) {
  if (cols == 0) return;
  const unsigned blocks = (cols + column_tile - 1) / column_tile;
  sum_rows_kernel<<<blocks, dim3(column_tile, row_lanes), 0, s>>>(matrix, rows, cols, beta, out);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

void add_channel_vector(cudaStream_t s, float* data, const float* vector, int batch, int channels,
                        int spatial) {
  const size_t count = static_cast<size_t>(batch) * channels * spatial;
  for_each(s, count, add_channel_vector_op{data, vector, channels, spatial});
}

void sum_channels(cudaStream_t s, const float* data, int batch, int channels, int spatial,
                  float beta, float* out) {
  if (channels == 0) return;
  sum_channels_kernel<<<channels, block_threads, 0, s>>>(data, batch, channels, spatial, beta, out);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

void transpose_batched(cudaStream_t s, const float* in, float* out, int batch, int rows, int cols) {
  if (batch == 0 || rows == 0 || cols == 0) return;
  const unsigned column_tiles = (cols + transpose_tile - 1) / transpose_tile;
  const unsigned row_tiles = (rows + transpose_tile - 1) / transpose_tile;
  const dim3 grid(column_tiles, std::min(row_tiles, 65535u),
                  std::min(static_cast<unsigned>(batch), 65535u));
  transpose_kernel<<<grid, dim3(transpose_tile, transpose_lanes), 0, s>>>(in, out, batch, rows,
                                                                          cols);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

void axpy(cudaStream_t s, float alpha, const float* x, float* y, size_t count) {
  for_each(s, count, axpy_op{alpha, x, y});
}

void multiply(cudaStream_t s, const float* a, const float* b, float* out, size_t count) {
  for_each(s, count, multiply_op{a, b, out});
}

size_t sum_scratch_count(size_t count) {
  const size_t blocks = sum_blocks(count);
  return blocks > 1 ? blocks : 0;
}

void sum(cudaStream_t s, const float* x, size_t count, float* out, float* scratch) {
  const size_t blocks = sum_blocks(count);
  if (blocks == 1) {
    strided_sum_kernel<<<1, block_threads, 0, s>>>(x, count, out);
  } else {
    strided_sum_kernel<<<static_cast<unsigned>(blocks), block_threads, 0, s>>>(x, count, scratch);
    TROUPE_CUDA_CHECK(cudaGetLastError());
    strided_sum_kernel<<<1, block_threads, 0, s>>>(scratch, blocks, out);
  }
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

void activation_forward(cudaStream_t s, activation f, const float* x, float* y, size_t count) {
  for_each(s, count, activation_forward_op{f, x, y});
}

void activation_backward(cudaStream_t s, activation f, const float* x, const float* y,
                         const float* dy, float* dx, size_t count) {
  for_each(s, count, activation_backward_op{f, x, y, dy, dx});
}

size_t softmax_cross_entropy_scratch_count(int rows) { return 2 * static_cast<size_t>(rows); }

void softmax_cross_entropy(cudaStream_t s, const float* logits, const int32_t* labels, int rows,
                           int cols, float gradient_scale, float* gradient, float* loss_sum,
                           float* correct, float* scratch) {
  float* row_loss = scratch;
  float* row_correct = scratch + rows;
  if (rows > 0) {
    const unsigned blocks = (rows + rows_per_block - 1) / rows_per_block;
    softmax_cross_entropy_kernel<<<blocks, block_threads, 0, s>>>(
        logits, labels, rows, cols, gradient_scale, gradient, row_loss, row_correct);
    TROUPE_CUDA_CHECK(cudaGetLastError());
  }
  row_totals_kernel<<<1, block_threads, 0, s>>>(row_loss, row_correct, rows, loss_sum, correct);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

void im2col(cudaStream_t s, const convolution_geometry& g, const float* image, float* columns) {
  const size_t count =
      static_cast<size_t>(g.batch) * g.out_height * g.out_width * g.channels * g.kernel * g.kernel;
  for_each(s, count, im2col_op{g, image, columns});
}

void col2im(cudaStream_t s, const convolution_geometry& g, const float* columns, float* image) {
  const size_t count = static_cast<size_t>(g.batch) * g.channels * g.height * g.width;
  for_each(s, count, col2im_op{g, columns, image});
}

void max_pool_forward(cudaStream_t s, const pooling_geometry& g, const float* x, float* y,
                      int32_t* argmax) {
  const size_t count = static_cast<size_t>(g.batch) * g.channels * g.out_height * g.out_width;
  for_each(s, count, max_pool_forward_op{g, x, y, argmax});
}

void max_pool_backward(cudaStream_t s, const pooling_geometry& g, const float* dy,
                       const int32_t* argmax, float* dx) {
  const size_t count = static_cast<size_t>(g.batch) * g.channels * g.height * g.width;
  for_each(s, count, max_pool_backward_op{g, dy, argmax, dx});
}

void dropout_forward(cudaStream_t s, const float* x, float* y, float* mask, size_t count,
                     float probability, float scale, uint64_t seed, uint64_t offset) {
  for_each(s, count, dropout_op{x, y, mask, probability, scale, seed, offset});
}

void sgd_step(cudaStream_t s, float* weights, const float* gradient, float* velocity, size_t count,
              const sgd_parameters& p) {
  float* used_velocity = p.momentum != 0.0f ? velocity : nullptr;
  for_each(s, count, sgd_op{weights, gradient, used_velocity, p});
}

void adam_step(cudaStream_t s, float* weights, const float* gradient, float* first_moment,
               float* second_moment, size_t count, const adam_parameters& p) {
  for_each(s, count, adam_op{weights, gradient, first_moment, second_moment, p, step_sizes_of(p)});
}

}  // namespace troupe::layers::cuda_kernels
