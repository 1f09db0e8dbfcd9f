#include "layers/cpu/cpu_recurrent_kernels.h"

#include <cstdint>

#include "layers/cpu/cpu_math.h"

namespace troupe::layers::cpu {
namespace {

/// 1 / (1 + e^-x), with e^-x kept inside exp_in_range's domain (beyond it the result is 0 or 1
/// to float precision anyway).
inline float sigmoid(float x) {
  const float exponent = blend(x > 87.0f, -87.0f, blend(x < -88.0f, 88.0f, -x));
  return 1.0f / (1.0f + exp_in_range(exponent));
}

void sigmoid_in_place(float* values, int count) {
  for (int j = 0; j < count; ++j) values[j] = sigmoid(values[j]);
}

}  // namespace

void lstm_cell_forward(const lstm_cell_geometry& g, float* gates, const float* input, float* output,
                       int first_row, int last_row) {
  const int hidden = g.hidden;
  const int children = g.children;
  for (int r = first_row; r < last_row; ++r) {
    float* a = gates + int64_t(r) * g.gate_width();
    const float* states = input + int64_t(r) * g.input_width() + g.x_width;
    float* out = output + int64_t(r) * 2 * hidden;
    sigmoid_in_place(a, (1 + children) * hidden);  // i, f_1 .. f_N
    float* u = a + (1 + children) * hidden;
    for (int j = 0; j < hidden; ++j) u[j] = tanh_vectorizable(u[j]);
    const float* o = u + hidden;
    sigmoid_in_place(u + hidden, hidden);
    for (int j = 0; j < hidden; ++j) {
      float c = a[j] * u[j];
      for (int k = 0; k < children; ++k) {
        c += a[(1 + k) * hidden + j] * states[(2 * k + 1) * hidden + j];
      }
      out[hidden + j] = c;
      out[j] = o[j] * tanh_vectorizable(c);
    }
  }
}

void lstm_cell_backward(const lstm_cell_geometry& g, const float* gates, const float* input,
                        const float* output, const float* output_gradient, float* gate_gradient,
                        float* input_gradient, int first_row, int last_row) {
  const int hidden = g.hidden;
  const int children = g.children;
  const int o_offset = (2 + children) * hidden;
  const int u_offset = (1 + children) * hidden;
  for (int r = first_row; r < last_row; ++r) {
    const float* a = gates + int64_t(r) * g.gate_width();
    float* da = gate_gradient + int64_t(r) * g.gate_width();
    const int64_t input_row = int64_t(r) * g.input_width() + g.x_width;
    const float* out = output + int64_t(r) * 2 * hidden;
    const float* dout = output_gradient + int64_t(r) * 2 * hidden;
    for (int j = 0; j < hidden; ++j) {
      const float cell = tanh_vectorizable(out[hidden + j]);
      const float i = a[j], u = a[u_offset + j], o = a[o_offset + j];
      const float dh = dout[j];
      const float dc = dout[hidden + j] + dh * o * (1.0f - cell * cell);
      da[j] = dc * u * i * (1.0f - i);
      da[u_offset + j] = dc * i * (1.0f - u * u);
      da[o_offset + j] = dh * cell * o * (1.0f - o);
      for (int k = 0; k < children; ++k) {
        const int64_t child_cell = input_row + (2 * k + 1) * hidden + j;
        const float f = a[(1 + k) * hidden + j];
        da[(1 + k) * hidden + j] = dc * input[child_cell] * f * (1.0f - f);
        if (input_gradient != nullptr) input_gradient[child_cell] = dc * f;
      }
    }
  }
}

}  // namespace troupe::layers::cpu
