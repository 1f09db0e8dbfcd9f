#pragma once

// Private to cuda_kernels.cu: the grid-stride launcher for element-wise work and the functors
// it applies, one per element-wise operation of the backend. A functor holds its arguments by
// value and computes the element(s) of one index, so each operation is one small struct.

#include <algorithm>
#include <cmath>

#include "layers/cuda/cuda_kernels.cuh"
#include "layers/random.h"

namespace troupe::layers::cuda_kernels {

constexpr int block_threads = 256;
constexpr size_t max_blocks = 65536;
constexpr float sqrt_half = 0.70710678118654752440f;
constexpr float inverse_sqrt_two_pi = 0.39894228040143267794f;
constexpr int warp_size = 32;
constexpr unsigned full_warp = 0xffffffffu;

/// A butterfly sum over a warp: every lane ends with the same bits, since a + b == b + a.
__device__ inline float warp_sum(float value) {
  for (int offset = warp_size / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(full_warp, value, offset);
  }
  return value;
}

template <typename Op>
__global__ void for_each_kernel(size_t count, Op op) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    op(i);
  }
}

/// Runs op(i) for every i < count on `s`.
template <typename Op>
void for_each(cudaStream_t s, size_t count, const Op& op) {
  if (count == 0) return;
  const size_t blocks = std::min((count + block_threads - 1) / block_threads, max_blocks);
  for_each_kernel<<<static_cast<unsigned>(blocks), block_threads, 0, s>>>(count, op);
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

// ---- element-wise functors ------------------------------------------------------------------

struct fill_op {
  float* data;
  float value;
  __device__ void operator()(size_t i) const { data[i] = value; }
};

struct scale_matrix_op {
  float* matrix;
  int cols;
  int ld;
  float beta;
  __device__ void operator()(size_t i) const {
    float* element = matrix + (i / cols) * ld + i % cols;
    *element = beta == 0.0f ? 0.0f : beta * *element;
  }
};

struct add_row_vector_op {
  float* matrix;
  const float* vector;
  int cols;
  __device__ void operator()(size_t i) const { matrix[i] += vector[i % cols]; }
};

struct add_channel_vector_op {
  float* data;
  const float* vector;
  int channels;
  int spatial;
  __device__ void operator()(size_t i) const { data[i] += vector[(i / spatial) % channels]; }
};

struct axpy_op {
  float alpha;
  const float* x;
  float* y;
  __device__ void operator()(size_t i) const { y[i] += alpha * x[i]; }
};

struct multiply_op {
  const float* a;
  const float* b;
  float* out;
  __device__ void operator()(size_t i) const { out[i] = a[i] * b[i]; }
};

__device__ inline float gelu_cdf(float x) { return 0.5f * (1.0f + erff(x * sqrt_half)); }

struct activation_forward_op {
  activation f;
  const float* x;
  float* y;
  __device__ void operator()(size_t i) const {
    const float v = x[i];
    switch (f) {
      case activation::relu:
        y[i] = v > 0.0f ? v : 0.0f;
        break;
      case activation::tanh:
        y[i] = tanhf(v);
        break;
      case activation::gelu:
        y[i] = v * gelu_cdf(v);
        break;
    }
  }
};

struct activation_backward_op {
  activation f;
  const float* x;
  const float* y;
  const float* dy;
  float* dx;
  __device__ void operator()(size_t i) const {
    switch (f) {
      case activation::relu:
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
        break;
      case activation::tanh:
        dx[i] = dy[i] * (1.0f - y[i] * y[i]);
        break;
      case activation::gelu: {
        const float v = x[i];
        const float density = expf(-0.5f * v * v) * inverse_sqrt_two_pi;
        dx[i] = dy[i] * (gelu_cdf(v) + v * density);
        break;
      }
    }
  }
};

struct im2col_op {
  convolution_geometry g;
  const float* image;
  float* columns;
  __device__ void operator()(size_t index) const {
    const int k = g.kernel;
    const size_t patch = static_cast<size_t>(g.channels) * k * k;
    const int column = static_cast<int>(index % patch);
    size_t row = index / patch;
    const int j = column % k;
    const int i = (column / k) % k;
    const int c = column / (k * k);
    const int x = static_cast<int>(row % g.out_width);
    row /= g.out_width;
    const int y = static_cast<int>(row % g.out_height);
    const size_t n = row / g.out_height;
    const int image_y = y * g.stride - g.padding + i;
    const int image_x = x * g.stride - g.padding + j;
    const bool inside = image_y >= 0 && image_y < g.height && image_x >= 0 && image_x < g.width;
    columns[index] =
        inside ? image[((n * g.channels + c) * g.height + image_y) * g.width + image_x] : 0.0f;
  }
};

/// Gathers every column entry that came from one pixel, in the order of the output positions
/// (y, x) ascending, which is the order a plain scatter over the columns would add them in.
struct col2im_op {
  convolution_geometry g;
  const float* columns;
  float* image;
  __device__ void operator()(size_t index) const {
    const int k = g.kernel;
    const int w = static_cast<int>(index % g.width);
    size_t rest = index / g.width;
    const int h = static_cast<int>(rest % g.height);
    rest /= g.height;
    const int c = static_cast<int>(rest % g.channels);
    const size_t n = rest / g.channels;
    const size_t patch = static_cast<size_t>(g.channels) * k * k;
    float total = 0.0f;
    for (int i = k - 1; i >= 0; --i) {
      const int y_scaled = h + g.padding - i;
      if (y_scaled < 0 || y_scaled % g.stride != 0 || y_scaled / g.stride >= g.out_height) continue;
      const size_t y = y_scaled / g.stride;
      for (int j = k - 1; j >= 0; --j) {
        const int x_scaled = w + g.padding - j;
        if (x_scaled < 0 || x_scaled % g.stride != 0 || x_scaled / g.stride >= g.out_width) {
          continue;
        }
        const size_t x = x_scaled / g.stride;
        total += columns[((n * g.out_height + y) * g.out_width + x) * patch + (c * k + i) * k + j];
      }
    }
    image[index] = total;
  }
};

struct max_pool_forward_op {
  pooling_geometry g;
  const float* x;
  float* y;
  int32_t* argmax;
  __device__ void operator()(size_t index) const {
    const int out_x = static_cast<int>(index % g.out_width);
    const size_t rest = index / g.out_width;
    const int out_y = static_cast<int>(rest % g.out_height);
    const size_t plane = rest / g.out_height;
    const float* in = x + plane * g.height * g.width;
    const int top = out_y * g.stride;
    const int left = out_x * g.stride;
    const int bottom = min(top + g.kernel, g.height);
    const int right = min(left + g.kernel, g.width);
    int best_index = top * g.width + left;
    float best = in[best_index];
    for (int row = top; row < bottom; ++row) {
      for (int column = left; column < right; ++column) {
        const float v = in[row * g.width + column];
        if (v > best) {
          best = v;
          best_index = row * g.width + column;
        }
      }
    }
    y[index] = best;
    argmax[index] = best_index;
  }
};

/// The gather form of "dx = 0, then dx[argmax] += dy": each pixel adds the gradients of the
/// windows that chose it, in window order, which is the order the scatter adds them in.
struct max_pool_backward_op {
  pooling_geometry g;
  const float* dy;
  const int32_t* argmax;
  float* dx;
  __device__ void operator()(size_t index) const {
    const int w = static_cast<int>(index % g.width);
    const size_t rest = index / g.width;
    const int h = static_cast<int>(rest % g.height);
    const size_t plane = rest / g.height;
    const int first_y = h < g.kernel ? 0 : (h - g.kernel) / g.stride + 1;
    const int last_y = min(g.out_height - 1, h / g.stride);
    const int first_x = w < g.kernel ? 0 : (w - g.kernel) / g.stride + 1;
    const int last_x = min(g.out_width - 1, w / g.stride);
    const int target = h * g.width + w;
    const size_t base = plane * g.out_height * g.out_width;
    float total = 0.0f;
    for (int out_y = first_y; out_y <= last_y; ++out_y) {
      for (int out_x = first_x; out_x <= last_x; ++out_x) {
        const size_t window = base + static_cast<size_t>(out_y) * g.out_width + out_x;
        if (argmax[window] == target) total += dy[window];
      }
    }
    dx[index] = total;
  }
};

struct dropout_op {
  const float* x;
  float* y;
  float* mask;
  float probability;
  float scale;
  uint64_t seed;
  uint64_t offset;
  __device__ void operator()(size_t i) const {
    const float keep = dropout_keep(seed, offset + i, probability) ? scale : 0.0f;
    mask[i] = keep;
    y[i] = x[i] * keep;
  }
};

struct sgd_op {
  float* weights;
  const float* gradient;
  float* velocity;  // null when momentum == 0
  sgd_parameters p;
  __device__ void operator()(size_t i) const {
    const float g = p.gradient_scale * gradient[i] + p.weight_decay * weights[i];
    float step = g;
    if (velocity != nullptr) {
      const float v = p.momentum * velocity[i] + g;
      velocity[i] = v;
      step = p.nesterov ? g + p.momentum * v : v;
    }
    weights[i] -= p.learning_rate * step;
  }
};

struct adam_op {
  float* weights;
  const float* gradient;
  float* first_moment;
  float* second_moment;
  adam_parameters p;
  adam_step_sizes sizes;
  __device__ void operator()(size_t i) const {
    // AdamW's decay first, as axpy_op would apply it.
    if (p.decoupled_decay != 0.0f) weights[i] += -p.decoupled_decay * weights[i];
    const float g = p.gradient_scale * gradient[i] + p.weight_decay * weights[i];
    const float m = p.beta1 * first_moment[i] + (1.0f - p.beta1) * g;
    const float v = p.beta2 * second_moment[i] + (1.0f - p.beta2) * g * g;
    first_moment[i] = m;
    second_moment[i] = v;
    // The CPU backend's order of operations: step_size * m / (sqrt(v) / sqrt(c2) + epsilon),
    // after NAdam's gradient term.
    const float denominator = sqrtf(v) * sizes.inverse_sqrt_correction2 + p.epsilon;
    float w = weights[i];
    if (p.nesterov) w -= sizes.gradient * g / denominator;
    weights[i] = w - sizes.moment * m / denominator;
  }
};

}  // namespace troupe::layers::cuda_kernels
