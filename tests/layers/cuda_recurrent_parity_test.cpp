// Parity of the CUDA backend's LSTM-cell kernels, and of whole lstm_cell and tree_lstm_cell
// layers, with the CPU reference; every test skips itself when no CUDA device is present.

#include "layers/layer.h"
#include "tests/layers/cuda_test_support.h"

namespace troupe::layers {
namespace {

using namespace cuda_testing;

lstm_cell_geometry cell_geometry(int rows, int hidden, int children, int x_width) {
  lstm_cell_geometry g;
  g.rows = rows;
  g.hidden = hidden;
  g.children = children;
  g.x_width = x_width;
  return g;
}

TEST(CudaRecurrentParityTest, LstmCellForwardAndBackwardKernels) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  for (int children : {1, 2, 3}) {
    const lstm_cell_geometry g = cell_geometry(37, 20, children, 7);
    const size_t gate_size = size_t(g.rows) * g.gate_width();
    const size_t input_size = size_t(g.rows) * g.input_width();
    const size_t output_size = size_t(g.rows) * 2 * g.hidden;
    const auto gates = random_values(gate_size, 301, -3.0f, 3.0f);
    const auto input = random_values(input_size, 302);
    const auto output_gradient = random_values(output_size, 303);
    expect_parity(
        pair,
        [&](backend& device) {
          const stream s = device.default_stream();
          device_array<float> a(device, gates), x(device, input), dy(device, output_gradient);
          device_array<float> y(device, std::vector<float>(output_size, nan_value));
          device_array<float> da(device, std::vector<float>(gate_size, nan_value));
          // Only the child cells' columns are written: NaN must stay in the others.
          device_array<float> dx(device, std::vector<float>(input_size, nan_value));
          device.lstm_cell_forward(s, g, a.data(), x.data(), y.data());
          device.lstm_cell_backward(s, g, a.data(), x.data(), y.data(), dy.data(), da.data(),
                                    dx.data());
          return outputs{a.download(), y.download(), da.download(), dx.download()};
        },
        tolerance{1e-5, 1e-6 * (1 + children)}, "lstm_cell kernels, " + std::to_string(children));
  }
}

TEST(CudaRecurrentParityTest, WholeCellsForwardAndBackward) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  for (int children : {0, 1, 2, 3}) {
    layer_spec spec;
    spec.type = children == 0 ? "lstm_cell" : "tree_lstm_cell";
    spec.out = 24;
    if (children > 0) spec.arity = children;
    const int width = 9 + 2 * std::max(children, 1) * spec.out;
    const int rows = 33;
    const auto input = random_values(size_t(rows) * width, 311);
    const auto output_gradient = random_values(size_t(rows) * 2 * spec.out, 312);
    expect_parity(
        pair,
        [&](backend& device) {
          const stream s = device.default_stream();
          auto cell = make_layer(device, s, spec, {width}, 13, 0);
          const run_options options{s};
          forward_result forward =
              cell->forward(options, tensor::from_host(device, s, {rows, width}, input));
          const tensor dy = tensor::from_host(device, s, forward.output.dims(), output_gradient);
          outputs result{forward.output.to_host(s),
                         cell->backward(options, *forward.context, dy, true).to_host(s)};
          for (parameter* p : cell->parameters()) result.push_back(p->gradient.to_host(s));
          return result;
        },
        summed(width), spec.type + " " + std::to_string(children));
  }
}

}  // namespace
}  // namespace troupe::layers
