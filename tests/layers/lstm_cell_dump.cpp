// Writes what the LSTM cells compute on the CPU backend, for lstm_cell_pytorch_test.py to
// recompute with PyTorch: per case, the cell's weights, its input rows, the upstream gradient,
// and the outputs and gradients troupe gets. One line per tensor: its name, its size, then its
// values, each printed exactly (9 significant digits).
// Usage: troupe_lstm_cell_dump FILE

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "layers/layer.h"
#include "tests/support/test_helpers.h"

namespace {

using namespace troupe::layers;

void write_tensor(std::FILE* file, const char* name, const std::vector<float>& values) {
  std::fprintf(file, "%s %zu", name, values.size());
  for (float v : values) std::fprintf(file, " %.9g", v);
  std::fprintf(file, "\n");
}

/// One case: `children` 0 is lstm_cell, otherwise a tree_lstm_cell of that arity.
void write_case(std::FILE* file, backend& device, int children, int rows, uint64_t seed) {
  const int hidden = 16, x_width = 10;
  layer_spec spec;
  spec.type = children == 0 ? "lstm_cell" : "tree_lstm_cell";
  spec.out = hidden;
  if (children > 0) spec.arity = children;
  const int n = children == 0 ? 1 : children;
  const int width = x_width + 2 * n * hidden;
  const stream s = device.default_stream();
  auto cell = make_layer(device, s, spec, {width}, seed, 0);
  std::vector<float> values = troupe::testing::random_values(size_t(rows) * width, seed + 1);
  // The last row is a leaf (a sequence's first part): every child's state is zero.
  std::fill(values.end() - width + x_width, values.end(), 0.0f);
  const std::vector<float> upstream =
      troupe::testing::random_values(size_t(rows) * 2 * hidden, seed + 2);
  const run_options options{s};
  forward_result forward =
      cell->forward(options, tensor::from_host(device, s, {rows, width}, values));
  const tensor gradient = tensor::from_host(device, s, forward.output.dims(), upstream);
  const tensor input_gradient = cell->backward(options, *forward.context, gradient, true);

  std::fprintf(file, "case %s children %d hidden %d x %d rows %d\n", spec.type.c_str(), n, hidden,
               x_width, rows);
  write_tensor(file, "weight", cell->parameters()[0]->value.to_host(s));
  write_tensor(file, "bias", cell->parameters()[1]->value.to_host(s));
  write_tensor(file, "input", values);
  write_tensor(file, "upstream", upstream);
  write_tensor(file, "output", forward.output.to_host(s));
  write_tensor(file, "input_gradient", input_gradient.to_host(s));
  write_tensor(file, "weight_gradient", cell->parameters()[0]->gradient.to_host(s));
  write_tensor(file, "bias_gradient", cell->parameters()[1]->gradient.to_host(s));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FILE\n", argv[0]);
    return 2;
  }
  std::FILE* file = std::fopen(argv[1], "w");
  if (file == nullptr) {
    std::perror(argv[1]);
    return 2;
  }
  auto device = troupe::testing::cpu_backend();
  write_case(file, *device, 0, 9, 101);
  for (int children : {1, 2, 3}) write_case(file, *device, children, 9, 201 + 10 * children);
  return std::fclose(file) == 0 ? 0 : 2;
}
