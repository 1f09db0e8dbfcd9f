// The CUDA backend's recurrent-cell kernels: one thread per (row, hidden unit), which reads its
// unit's gates and child cells and writes its unit's outputs (or gradients), so no two threads
// write the same value and nothing is summed across threads.

#include "layers/cuda/cuda_elementwise.cuh"
#include "layers/cuda/cuda_kernels.cuh"

namespace troupe::layers::cuda_kernels {
namespace {

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/// An lstm_cell_geometry's sizes as plain values: its member functions are host code.
struct cell_sizes {
  int hidden;
  int children;
  int x_width;
  int input_width;
  int gate_width;
};

cell_sizes sizes_of(const lstm_cell_geometry& g) {
  return {g.hidden, g.children, g.x_width, g.input_width(), g.gate_width()};
}

struct lstm_cell_forward_op {
  cell_sizes g;
  float* gates;
  const float* input;
  float* output;

  __device__ void operator()(size_t index) const {
    const int hidden = g.hidden;
    const int64_t r = static_cast<int64_t>(index / hidden);
    const int j = static_cast<int>(index % hidden);
    float* a = gates + r * g.gate_width;
    const float* states = input + r * g.input_width + g.x_width;
    const float i = sigmoid(a[j]);
    const float u = tanhf(a[(1 + g.children) * hidden + j]);
    const float o = sigmoid(a[(2 + g.children) * hidden + j]);
    a[j] = i;
    a[(1 + g.children) * hidden + j] = u;
    a[(2 + g.children) * hidden + j] = o;
    float c = i * u;
    for (int k = 0; k < g.children; ++k) {
      const float f = sigmoid(a[(1 + k) * hidden + j]);
      a[(1 + k) * hidden + j] = f;
      c += f * states[(2 * k + 1) * hidden + j];
    }
    float* out = output + r * 2 * hidden;
    out[hidden + j] = c;
    out[j] = o * tanhf(c);
  }
};

struct lstm_cell_backward_op {
  cell_sizes g;
  const float* gates;
  const float* input;
  const float* output;
  const float* output_gradient;
  float* gate_gradient;
  float* input_gradient;

  __device__ void operator()(size_t index) const {
    const int hidden = g.hidden;
    const int64_t r = static_cast<int64_t>(index / hidden);
    const int j = static_cast<int>(index % hidden);
    const int u_offset = (1 + g.children) * hidden;
    const int o_offset = (2 + g.children) * hidden;
    const float* a = gates + r * g.gate_width;
    float* da = gate_gradient + r * g.gate_width;
    const int64_t input_row = r * g.input_width + g.x_width;
    const float cell = tanhf(output[r * 2 * hidden + hidden + j]);
    const float i = a[j], u = a[u_offset + j], o = a[o_offset + j];
    const float dh = output_gradient[r * 2 * hidden + j];
    const float dc = output_gradient[r * 2 * hidden + hidden + j] + dh * o * (1.0f - cell * cell);
    da[j] = dc * u * i * (1.0f - i);
    da[u_offset + j] = dc * i * (1.0f - u * u);
    da[o_offset + j] = dh * cell * o * (1.0f - o);
    for (int k = 0; k < g.children; ++k) {
      const int64_t child_cell = input_row + (2 * k + 1) * hidden + j;
      const float f = a[(1 + k) * hidden + j];
      da[(1 + k) * hidden + j] = dc * input[child_cell] * f * (1.0f - f);
      if (input_gradient != nullptr) input_gradient[child_cell] = dc * f;
    }
  }
};

}  // namespace

void lstm_cell_forward(cudaStream_t s, const lstm_cell_geometry& g, float* gates,
                       const float* input, float* output) {
  for_each(s, static_cast<size_t>(g.rows) * g.hidden,
           lstm_cell_forward_op{sizes_of(g), gates, input, output});
}

void lstm_cell_backward(cudaStream_t s, const lstm_cell_geometry& g, const float* gates,
                        const float* input, const float* output, const float* output_gradient,
                        float* gate_gradient, float* input_gradient) {
  for_each(s, static_cast<size_t>(g.rows) * g.hidden,
           lstm_cell_backward_op{sizes_of(g), gates, input, output, output_gradient, gate_gradient,
                                 input_gradient});
}

}  // namespace troupe::layers::cuda_kernels
