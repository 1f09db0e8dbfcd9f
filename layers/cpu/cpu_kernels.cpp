#include "layers/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "layers/check.h"
#include "layers/cpu/cpu_math.h"
#include "layers/random.h"

// Every loop here is written so that GCC vectorizes it at -O3: one pass, no calls inside, the
// branch on the operation hoisted out, and __restrict parameters where buffers cannot alias
// (where the contract allows aliasing, the aliased case gets its own in-place loop). Sums use
// a fixed number of interleaved partial sums, so they vectorize without -ffast-math and still
// add in the same order on every run.

namespace troupe::layers::cpu {

namespace {

constexpr size_t sum_lanes = 16;

/// Sum of x[0, count) in a fixed order: `sum_lanes` interleaved partial sums, then the tail.
template <typename Accumulator>
Accumulator fixed_order_sum(const float* __restrict x, size_t count) {
  Accumulator partial[sum_lanes] = {};
  size_t i = 0;
  for (; i + sum_lanes <= count; i += sum_lanes) {
    for (size_t lane = 0; lane < sum_lanes; ++lane) partial[lane] += x[i + lane];
  }
  Accumulator total = 0;
  for (; i < count; ++i) total += x[i];
  for (size_t lane = 0; lane < sum_lanes; ++lane) total += partial[lane];
  return total;
}

void add_in_place(float* __restrict target, const float* __restrict source, size_t count) {
  for (size_t i = 0; i < count; ++i) target[i] += source[i];
}

void add_scalar(float* __restrict target, float value, size_t count) {
  for (size_t i = 0; i < count; ++i) target[i] += value;
}

void scale_in_place(float* __restrict target, float factor, size_t count) {
  for (size_t i = 0; i < count; ++i) target[i] *= factor;
}

template <typename Function>
void map_in_place(float* __restrict data, size_t count, Function f) {
  for (size_t i = 0; i < count; ++i) data[i] = f(data[i]);
}

template <typename Function>
void map_separate(const float* __restrict in, float* __restrict out, size_t count, Function f) {
  for (size_t i = 0; i < count; ++i) out[i] = f(in[i]);
}

/// out[i] = f(in[i]) where out may alias in.
template <typename Function>
void map(const float* in, float* out, size_t count, Function f) {
  if (in == out) {
    map_in_place(out, count, f);
  } else {
    map_separate(in, out, count, f);
  }
}

template <typename Function>
void gradient_in_place(const float* __restrict x, const float* __restrict y,
                       float* __restrict gradient, size_t count, Function f) {
  for (size_t i = 0; i < count; ++i) gradient[i] = f(x[i], y[i], gradient[i]);
}

template <typename Function>
void gradient_separate(const float* __restrict x, const float* __restrict y,
                       const float* __restrict dy, float* __restrict dx, size_t count, Function f) {
  for (size_t i = 0; i < count; ++i) dx[i] = f(x[i], y[i], dy[i]);
}

/// dx[i] = f(x[i], y[i], dy[i]) where dx may alias dy.
template <typename Function>
void map_gradient(const float* x, const float* y, const float* dy, float* dx, size_t count,
                  Function f) {
  if (dx == dy) {
    gradient_in_place(x, y, dx, count, f);
  } else {
    gradient_separate(x, y, dy, dx, count, f);
  }
}

}  // namespace

void add_row_vector(float* matrix, const float* vector, int rows, int cols) {
  for (int r = 0; r < rows; ++r) add_in_place(matrix + size_t(r) * cols, vector, cols);
}

void sum_rows(const float* matrix, int rows, int cols, float beta, float* out) {
  // Columns in blocks that stay in L1 while every row streams through contiguously.
  constexpr int block = 2048;
  for (int begin = 0; begin < cols; begin += block) {
    const int width = std::min(block, cols - begin);
    float* target = out + begin;
    if (beta == 0.0f) {
      std::fill_n(target, width, 0.0f);
    } else if (beta != 1.0f) {
      scale_in_place(target, beta, width);
    }
    for (int r = 0; r < rows; ++r) add_in_place(target, matrix + size_t(r) * cols + begin, width);
  }
}

void add_channel_vector(float* data, const float* vector, int batch, int channels, int spatial) {
  for (int n = 0; n < batch; ++n) {
    for (int c = 0; c < channels; ++c) {
      add_scalar(data + (size_t(n) * channels + c) * spatial, vector[c], spatial);
    }
  }
}

void sum_channels(const float* data, int batch, int channels, int spatial, float beta, float* out) {
  for (int c = 0; c < channels; ++c) {
    double total = 0.0;
    for (int n = 0; n < batch; ++n) {
      total += fixed_order_sum<float>(data + (size_t(n) * channels + c) * spatial, spatial);
    }
    out[c] = beta == 0.0f ? static_cast<float>(total) : static_cast<float>(beta * out[c] + total);
  }
}

namespace {

void transpose_tile(const float* __restrict in, float* __restrict out, int rows, int cols,
                    int row_begin, int row_end, int col_begin, int col_end) {
  for (int c = col_begin; c < col_end; ++c) {
    for (int r = row_begin; r < row_end; ++r) out[size_t(c) * rows + r] = in[size_t(r) * cols + c];
  }
}

}  // namespace

void transpose_batched(const float* in, float* out, int batch, int rows, int cols) {
  constexpr int tile = 32;
  const size_t matrix = size_t(rows) * cols;
  for (int b = 0; b < batch; ++b) {
    for (int r = 0; r < rows; r += tile) {
      for (int c = 0; c < cols; c += tile) {
        transpose_tile(in + b * matrix, out + b * matrix, rows, cols, r, std::min(r + tile, rows),
                       c, std::min(c + tile, cols));
      }
    }
  }
}

namespace {

void axpy_loop(float alpha, const float* __restrict x, float* __restrict y, size_t count) {
  for (size_t i = 0; i < count; ++i) y[i] += alpha * x[i];
}

void multiply_in_place(float* __restrict target, const float* __restrict factor, size_t count) {
  for (size_t i = 0; i < count; ++i) target[i] *= factor[i];
}

void multiply_separate(const float* __restrict a, const float* __restrict b, float* __restrict out,
                       size_t count) {
  for (size_t i = 0; i < count; ++i) out[i] = a[i] * b[i];
}

void square_in_place(float* __restrict data, size_t count) {
  for (size_t i = 0; i < count; ++i) data[i] *= data[i];
}

}  // namespace

void axpy(float alpha, const float* x, float* y, size_t count) {
  if (x == y) {
    scale_in_place(y, 1.0f + alpha, count);
  } else {
    axpy_loop(alpha, x, y, count);
  }
}

void multiply(const float* a, const float* b, float* out, size_t count) {
  if (a == b && out == a) {
    square_in_place(out, count);
  } else if (out == a) {
    multiply_in_place(out, b, count);
  } else if (out == b) {
    multiply_in_place(out, a, count);
  } else {
    multiply_separate(a, b, out, count);
  }
}

void sum(const float* x, size_t count, float* out) {
  out[0] = static_cast<float>(fixed_order_sum<double>(x, count));
}

void activation_forward(activation f, const float* x, float* y, size_t count) {
  switch (f) {
    case activation::relu:
      map(x, y, count, [](float v) { return v > 0.0f ? v : 0.0f; });
      return;
    case activation::tanh:
      map(x, y, count, [](float v) { return tanh_vectorizable(v); });
      return;
    case activation::gelu:
      map(x, y, count, [](float v) { return v * normal_cdf_vectorizable(v); });
      return;
  }
}

void activation_backward(activation f, const float* x, const float* y, const float* dy, float* dx,
                         size_t count) {
  switch (f) {
    case activation::relu:
      map_gradient(x, y, dy, dx, count,
                   [](float in, float, float grad) { return in > 0.0f ? grad : 0.0f; });
      return;
    case activation::tanh:
      map_gradient(x, y, dy, dx, count,
                   [](float, float out, float grad) { return grad * (1.0f - out * out); });
      return;
    case activation::gelu:
      // d/dx x·Φ(x) = Φ(x) + x·φ(x).
      map_gradient(x, y, dy, dx, count, [](float in, float, float grad) {
        return grad * (normal_cdf_vectorizable(in) + in * normal_pdf_vectorizable(in));
      });
      return;
  }
}

namespace {

/// Index of the first maximal entry of z[0, cols).
int first_maximum(const float* z, int cols) {
  int best = 0;
  for (int c = 1; c < cols; ++c) {
    if (z[c] > z[best]) best = c;
  }
  return best;
}

/// -log softmax(z)[label] of one row; writes the scaled gradient when `gradient` is not null.
double softmax_row(const float* __restrict z, int cols, int label, float gradient_scale,
                   float* __restrict gradient, float maximum) {
  double exp_sum = 0.0;
  for (int c = 0; c < cols; ++c) exp_sum += std::exp(static_cast<double>(z[c] - maximum));
  const double log_sum = std::log(exp_sum);
  if (gradient != nullptr) {
    const double scale = gradient_scale / exp_sum;
    for (int c = 0; c < cols; ++c) {
      gradient[c] = static_cast<float>(std::exp(static_cast<double>(z[c] - maximum)) * scale);
    }
    gradient[label] -= gradient_scale;
  }
  return log_sum - static_cast<double>(z[label] - maximum);
}

}  // namespace

void softmax_cross_entropy(const float* logits, const int32_t* labels, int rows, int cols,
                           float gradient_scale, float* gradient, float* loss_sum, float* correct) {
  double loss = 0.0;
  int hits = 0;
  for (int r = 0; r < rows; ++r) {
    const float* z = logits + size_t(r) * cols;
    const int label = labels[r];
    float* row_gradient = gradient == nullptr ? nullptr : gradient + size_t(r) * cols;
    if (label == ignored_label) {
      if (row_gradient != nullptr) std::fill_n(row_gradient, cols, 0.0f);
      continue;
    }
    TROUPE_CHECK(label >= 0 && label < cols);
    const int best = first_maximum(z, cols);
    hits += best == label ? 1 : 0;
    loss += softmax_row(z, cols, label, gradient_scale, row_gradient, z[best]);
  }
  loss_sum[0] = static_cast<float>(loss);
  correct[0] = static_cast<float>(hits);
}

void dropout_forward(const float* x, float* y, float* mask, size_t count, float probability,
                     uint64_t seed, uint64_t offset) {
  // With probability 1 nothing is kept; a zero scale keeps 0 * inf from making NaN.
  const float scale = probability < 1.0f ? 1.0f / (1.0f - probability) : 0.0f;
  for (size_t i = 0; i < count; ++i) {
    // A product rather than a select: half the draws are dropped, so a branch would mispredict.
    const float m = static_cast<float>(dropout_keep(seed, offset + i, probability)) * scale;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

namespace {

void sgd_plain(float* __restrict w, const float* __restrict grad, size_t count, float lr,
               float decay, float scale) {
  for (size_t i = 0; i < count; ++i) w[i] -= lr * (scale * grad[i] + decay * w[i]);
}

void sgd_momentum(float* __restrict w, const float* __restrict grad, float* __restrict v,
                  size_t count, float lr, float momentum, float decay, float scale) {
  for (size_t i = 0; i < count; ++i) {
    const float velocity = momentum * v[i] + (scale * grad[i] + decay * w[i]);
    v[i] = velocity;
    w[i] -= lr * velocity;
  }
}

/// Nesterov's look-ahead: the step takes the gradient plus the momentum of the new velocity.
void sgd_nesterov(float* __restrict w, const float* __restrict grad, float* __restrict v,
                  size_t count, float lr, float momentum, float decay, float scale) {
  for (size_t i = 0; i < count; ++i) {
    const float g = scale * grad[i] + decay * w[i];
    const float velocity = momentum * v[i] + g;
    v[i] = velocity;
    w[i] -= lr * (g + momentum * velocity);
  }
}

}  // namespace

void sgd_step(float* weights, const float* gradient, float* velocity, size_t count,
              const sgd_parameters& p) {
  if (p.momentum == 0.0f) {
    sgd_plain(weights, gradient, count, p.learning_rate, p.weight_decay, p.gradient_scale);
    return;
  }
  TROUPE_CHECK(velocity != nullptr);
  (p.nesterov ? sgd_nesterov : sgd_momentum)(weights, gradient, velocity, count, p.learning_rate,
                                             p.momentum, p.weight_decay, p.gradient_scale);
}

namespace {

struct adam_constants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, decay, scale, step_size,
      inverse_sqrt_correction2, epsilon, gradient_step;
};

/// One weight's Adam update (NAdam's look-ahead with `nesterov`); the SSE loop below performs
/// the same operations in the same order.
template <bool nesterov>
inline void adam_update(float& w, float grad, float& m, float& v, const adam_constants& k) {
  const float g = k.scale * grad + k.decay * w;
  m = k.beta1 * m + k.one_minus_beta1 * g;
  v = k.beta2 * v + k.one_minus_beta2 * g * g;
  const float denominator = std::sqrt(v) * k.inverse_sqrt_correction2 + k.epsilon;
  if (nesterov) w -= k.gradient_step * g / denominator;
  w -= k.step_size * m / denominator;
}

// GCC does not vectorize std::sqrt unless -fno-math-errno is given for the whole file, so the
// Adam loop uses SSE directly where it is available.
#if defined(__SSE2__)
template <bool nesterov>
size_t adam_sse(float* __restrict w, const float* __restrict grad, float* __restrict m,
                float* __restrict v, size_t count, const adam_constants& k) {
  const __m128 beta1 = _mm_set1_ps(k.beta1), one_minus_beta1 = _mm_set1_ps(k.one_minus_beta1);
  const __m128 beta2 = _mm_set1_ps(k.beta2), one_minus_beta2 = _mm_set1_ps(k.one_minus_beta2);
  const __m128 decay = _mm_set1_ps(k.decay), scale = _mm_set1_ps(k.scale);
  const __m128 step_size = _mm_set1_ps(k.step_size), epsilon = _mm_set1_ps(k.epsilon);
  const __m128 inverse_sqrt_correction2 = _mm_set1_ps(k.inverse_sqrt_correction2);
  const __m128 gradient_step = _mm_set1_ps(k.gradient_step);
  size_t i = 0;
  for (; i + 4 <= count; i += 4) {
    const __m128 weight = _mm_loadu_ps(w + i);
    const __m128 g =
        _mm_add_ps(_mm_mul_ps(scale, _mm_loadu_ps(grad + i)), _mm_mul_ps(decay, weight));
    const __m128 first =
        _mm_add_ps(_mm_mul_ps(beta1, _mm_loadu_ps(m + i)), _mm_mul_ps(one_minus_beta1, g));
    const __m128 second = _mm_add_ps(_mm_mul_ps(beta2, _mm_loadu_ps(v + i)),
                                     _mm_mul_ps(_mm_mul_ps(one_minus_beta2, g), g));
    const __m128 denominator =
        _mm_add_ps(_mm_mul_ps(_mm_sqrt_ps(second), inverse_sqrt_correction2), epsilon);
    _mm_storeu_ps(m + i, first);
    _mm_storeu_ps(v + i, second);
    __m128 updated = weight;
    if (nesterov) {
      updated = _mm_sub_ps(updated, _mm_div_ps(_mm_mul_ps(gradient_step, g), denominator));
    }
    _mm_storeu_ps(w + i,
                  _mm_sub_ps(updated, _mm_div_ps(_mm_mul_ps(step_size, first), denominator)));
  }
  return i;
}
#else
template <bool nesterov>
size_t adam_sse(float*, const float*, float*, float*, size_t, const adam_constants&) {
  return 0;
}
#endif

template <bool nesterov>
void adam_loop(float* weights, const float* gradient, float* first_moment, float* second_moment,
               size_t count, const adam_constants& k) {
  size_t i = adam_sse<nesterov>(weights, gradient, first_moment, second_moment, count, k);
  for (; i < count; ++i) {
    adam_update<nesterov>(weights[i], gradient[i], first_moment[i], second_moment[i], k);
  }
}

}  // namespace

void adam_step(float* weights, const float* gradient, float* first_moment, float* second_moment,
               size_t count, const adam_parameters& p) {
  TROUPE_CHECK(p.step >= 1);
  // PyTorch's form: w -= (lr / c1) * m / (sqrt(v) / sqrt(c2) + eps) with c = 1 - beta^t.
  const adam_step_sizes sizes = step_sizes_of(p);
  const adam_constants k{
      p.beta1,        1.0f - p.beta1,   p.beta2,      1.0f - p.beta2,
      p.weight_decay, p.gradient_scale, sizes.moment, sizes.inverse_sqrt_correction2,
      p.epsilon,      sizes.gradient};
  (p.nesterov ? adam_loop<true> : adam_loop<false>)(weights, gradient, first_moment, second_moment,
                                                    count, k);
}

}  // namespace troupe::layers::cpu
