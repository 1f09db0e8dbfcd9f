#include "layers/cpu/cpu_transformer_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "layers/cpu/cpu_math.h"

namespace troupe::layers::cpu {

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* normalized, float* rstd, int first_row, int last_row, int cols,
                        float epsilon) {
  for (int r = first_row; r < last_row; ++r) {
    const float* in = x + int64_t(r) * cols;
    float* out = y + int64_t(r) * cols;
    float* hat = normalized + int64_t(r) * cols;
    float sum = 0;
    for (int c = 0; c < cols; ++c) sum += in[c];
    const float mean = sum / static_cast<float>(cols);
    float squares = 0;
    for (int c = 0; c < cols; ++c) {
      const float d = in[c] - mean;
      squares += d * d;
    }
    const float inverse = 1.0f / std::sqrt(squares / static_cast<float>(cols) + epsilon);
    rstd[r] = inverse;
    for (int c = 0; c < cols; ++c) {
      hat[c] = (in[c] - mean) * inverse;
      out[c] = hat[c] * gamma[c] + beta[c];
    }
  }
}

void layer_norm_backward(const float* dy, const float* gamma, const float* normalized,
                         const float* rstd, float* dx, int first_row, int last_row, int cols) {
  for (int r = first_row; r < last_row; ++r) {
    const float* grad = dy + int64_t(r) * cols;
    const float* hat = normalized + int64_t(r) * cols;
    float* out = dx + int64_t(r) * cols;
    float sum = 0, dot = 0;
    for (int c = 0; c < cols; ++c) {
      const float g = grad[c] * gamma[c];
      sum += g;
      dot += g * hat[c];
    }
    const float mean = sum / static_cast<float>(cols);
    const float mean_dot = dot / static_cast<float>(cols);
    for (int c = 0; c < cols; ++c) {
      out[c] = rstd[r] * (grad[c] * gamma[c] - mean - hat[c] * mean_dot);
    }
  }
}

void causal_softmax_forward(const float* scores, float* probabilities, int first_row, int last_row,
                            int t, float scale) {
  for (int r = first_row; r < last_row; ++r) {
    const int visible = r % t + 1;
    const float* in = scores + int64_t(r) * t;
    float* out = probabilities + int64_t(r) * t;
    float largest = in[0] * scale;
    for (int j = 1; j < visible; ++j) largest = std::max(largest, in[j] * scale);
    float total = 0;
    for (int j = 0; j < visible; ++j) {
      // exp_in_range covers [-87, 88]; a shifted score below that contributes nothing anyway.
      const float shifted = in[j] * scale - largest;
      const float e = blend(shifted < -87.0f, 0.0f, exp_in_range(std::max(shifted, -87.0f)));
      out[j] = e;
      total += e;
    }
    const float inverse = 1.0f / total;
    for (int j = 0; j < visible; ++j) out[j] *= inverse;
    for (int j = visible; j < t; ++j) out[j] = 0.0f;
  }
}

void softmax_backward(const float* probabilities, const float* dp, float* dscores, int first_row,
                      int last_row, int cols, float scale) {
  for (int r = first_row; r < last_row; ++r) {
    const float* p = probabilities + int64_t(r) * cols;
    const float* grad = dp + int64_t(r) * cols;
    float* out = dscores + int64_t(r) * cols;
    float dot = 0;
    for (int j = 0; j < cols; ++j) dot += grad[j] * p[j];
    for (int j = 0; j < cols; ++j) out[j] = scale * p[j] * (grad[j] - dot);
  }
}

namespace {

/// The row of `id` (an exact integer stored as a float), or -1 when outside [0, vocab).
int64_t row_of(float id, int vocab) {
  if (!(id >= 0.0f && id < static_cast<float>(vocab))) return -1;
  return static_cast<int64_t>(id);
}

}  // namespace

void embedding_forward(const float* ids, const float* table, float* out, int first, int last,
                       int dim, int vocab) {
  for (int i = first; i < last; ++i) {
    const int64_t row = row_of(ids[i], vocab);
    float* target = out + int64_t(i) * dim;
    if (row < 0) {
      std::fill_n(target, dim, 0.0f);
    } else {
      std::memcpy(target, table + row * dim, sizeof(float) * dim);
    }
  }
}

void embedding_backward(const float* ids, const float* dout, float* table_gradient, int count,
                        int dim, int vocab, float beta, int first_column, int last_column) {
  const int width = last_column - first_column;
  if (width <= 0) return;
  for (int64_t v = 0; v < vocab; ++v) {
    float* row = table_gradient + v * dim + first_column;
    if (beta == 0.0f) {
      std::fill_n(row, width, 0.0f);
    } else {
      for (int c = 0; c < width; ++c) row[c] *= beta;
    }
  }
  for (int i = 0; i < count; ++i) {
    const int64_t row = row_of(ids[i], vocab);
    if (row < 0) continue;
    float* target = table_gradient + row * dim + first_column;
    const float* source = dout + int64_t(i) * dim + first_column;
    for (int c = 0; c < width; ++c) target[c] += source[c];
  }
}

}  // namespace troupe::layers::cpu
