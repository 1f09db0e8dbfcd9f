// The LSTM cells over rows (lstm_cell, tree_lstm_cell): their equations, finite-difference
// gradients, ragged batches with one context per forward, shape errors and seeded weights.

#include <gtest/gtest.h>

#include <cmath>

#include "layers/layer.h"
#include "layers/model.h"
#include "tests/support/gradient_checker.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers {
namespace {

constexpr int hidden = 3;
constexpr int x_width = 2;

layer_spec cell_spec(int children) {
  layer_spec spec;
  spec.type = children == 0 ? "lstm_cell" : "tree_lstm_cell";
  spec.out = hidden;
  if (children > 0) spec.arity = children;
  return spec;
}

/// Children of a spec: lstm_cell has one.
int children_of(const layer_spec& spec) { return spec.type == "lstm_cell" ? 1 : spec.arity; }

int input_width(const layer_spec& spec) { return x_width + 2 * children_of(spec) * hidden; }

/// `rows` rows of distinct random values (`seed`), each [x | h_1 | c_1 | ...].
std::vector<float> rows_of(const layer_spec& spec, int rows, uint64_t seed) {
  return testing::random_values(size_t(rows) * input_width(spec), seed);
}

struct cell_run {
  std::vector<float> output;
  std::vector<float> input_gradient;
  std::vector<std::vector<float>> parameter_gradients;
};

/// One forward and backward of `cell` over `rows` with upstream gradient `upstream`.
cell_run run_cell(layer& cell, backend& device, const std::vector<float>& rows,
                  const std::vector<float>& upstream) {
  const stream s = device.default_stream();
  const run_options options{s};
  const int64_t count = int64_t(rows.size()) / cell.input_shape()[0];
  const tensor input = tensor::from_host(device, s, {count, cell.input_shape()[0]}, rows);
  forward_result forward = cell.forward(options, input);
  const tensor gradient = tensor::from_host(device, s, forward.output.dims(), upstream);
  for (parameter* p : cell.parameters()) p->has_gradient = false;
  cell_run result;
  result.output = forward.output.to_host(s);
  result.input_gradient = cell.backward(options, *forward.context, gradient, true).to_host(s);
  for (parameter* p : cell.parameters())
    result.parameter_gradients.push_back(p->gradient.to_host(s));
  return result;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

/// Tai et al.'s equations, in double, with the cell's own weights: [h | c] of every row.
std::vector<double> reference_forward(layer& cell, backend& device, const layer_spec& spec,
                                      const std::vector<float>& rows) {
  const stream s = device.default_stream();
  const std::vector<float> weight = cell.parameters()[0]->value.to_host(s);
  const std::vector<float> bias = cell.parameters()[1]->value.to_host(s);
  const int n = children_of(spec), width = input_width(spec), columns = x_width + n * hidden;
  std::vector<double> result;
  for (size_t r = 0; r < rows.size() / width; ++r) {
    const float* row = rows.data() + r * width;
    std::vector<float> gemm_input(row, row + x_width);  // [x | h_1 .. h_N]
    for (int k = 0; k < n; ++k) {
      gemm_input.insert(gemm_input.end(), row + x_width + 2 * k * hidden,
                        row + x_width + (2 * k + 1) * hidden);
    }
    std::vector<double> gates((3 + n) * hidden);
    for (size_t g = 0; g < gates.size(); ++g) {
      gates[g] = bias[g];
      for (int c = 0; c < columns; ++c) gates[g] += double(weight[g * columns + c]) * gemm_input[c];
    }
    std::vector<double> h(hidden), cell_state(hidden);
    for (int j = 0; j < hidden; ++j) {
      double c = sigmoid(gates[j]) * std::tanh(gates[(1 + n) * hidden + j]);
      for (int k = 0; k < n; ++k) {
        c += sigmoid(gates[(1 + k) * hidden + j]) * row[x_width + (2 * k + 1) * hidden + j];
      }
      cell_state[j] = c;
      h[j] = sigmoid(gates[(2 + n) * hidden + j]) * std::tanh(c);
    }
    result.insert(result.end(), h.begin(), h.end());
    result.insert(result.end(), cell_state.begin(), cell_state.end());
  }
  return result;
}

TEST(LstmCellTest, ForwardFollowsTheCellEquations) {
  auto device = testing::cpu_backend();
  for (int children : {0, 1, 2, 3}) {
    const layer_spec spec = cell_spec(children);
    auto cell = make_layer(*device, device->default_stream(), spec, {input_width(spec)}, 5, 0);
    std::vector<float> rows = rows_of(spec, 4, 11);
    // The last row is a leaf: every child's state is zero.
    std::fill(rows.end() - input_width(spec) + x_width, rows.end(), 0.0f);
    const std::vector<float> upstream = testing::random_values(4 * 2 * hidden, 12);
    const std::vector<float> output = run_cell(*cell, *device, rows, upstream).output;
    const std::vector<double> expected = reference_forward(*cell, *device, spec, rows);
    ASSERT_EQ(output.size(), expected.size());
    for (size_t i = 0; i < output.size(); ++i) {
      EXPECT_NEAR(output[i], expected[i], 1e-6)
          << spec.type << " with " << children << " element " << i;
    }
  }
}

void check_gradients(const layer_spec& spec) {
  testing::gradient_checker checker(spec, {input_width(spec)}, rows_of(spec, 3, 21));
  checker.check_input_gradient();
  checker.check_parameter_gradients();
}

TEST(LstmCellTest, LstmCellGradientsMatchFiniteDifferences) {
  check_gradients(cell_spec(0));
  layer_spec without_bias = cell_spec(0);
  without_bias.bias = false;
  check_gradients(without_bias);
}

TEST(LstmCellTest, TreeCellGradientsMatchFiniteDifferencesForOneTwoAndThreeChildren) {
  for (int children : {1, 2, 3}) {
    SCOPED_TRACE("arity " + std::to_string(children));
    check_gradients(cell_spec(children));
  }
}

TEST(LstmCellTest, TreeCellWithOneChildIsTheLstmCell) {
  auto device = testing::cpu_backend();
  const stream s = device->default_stream();
  const layer_spec lstm = cell_spec(0), tree = cell_spec(1);
  auto first = make_layer(*device, s, lstm, {input_width(lstm)}, 8, 0);
  auto second = make_layer(*device, s, tree, {input_width(tree)}, 8, 0);
  const std::vector<float> rows = rows_of(lstm, 5, 31);
  const std::vector<float> upstream = testing::random_values(5 * 2 * hidden, 32);
  const cell_run a = run_cell(*first, *device, rows, upstream);
  const cell_run b = run_cell(*second, *device, rows, upstream);
  EXPECT_EQ(a.output, b.output);
  EXPECT_EQ(a.input_gradient, b.input_gradient);
  EXPECT_EQ(a.parameter_gradients, b.parameter_gradients);
}

void expect_near_all(const std::vector<float>& actual, const std::vector<float>& expected,
                     const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * (1.0 + std::fabs(expected[i]))) << what << " " << i;
  }
}

TEST(LstmCellTest, RaggedBatchesInFlightKeepTheirOwnContexts) {
  // Two visits of 5 and 2 rows in flight at once, their backward passes in reverse order (the
  // second split into its halves), add up to one visit over all 7 rows.
  auto device = testing::cpu_backend();
  const stream s = device->default_stream();
  const run_options options{s};
  const layer_spec spec = cell_spec(2);
  const int width = input_width(spec);
  auto cell = make_layer(*device, s, spec, {width}, 3, 0);
  const std::vector<float> rows = rows_of(spec, 7, 41);
  const std::vector<float> upstream = testing::random_values(7 * 2 * hidden, 42);
  const cell_run whole = run_cell(*cell, *device, rows, upstream);

  for (parameter* p : cell->parameters()) p->has_gradient = false;
  const int split = 5;
  auto part = [&](const std::vector<float>& values, int first, int last, int row_width) {
    return std::vector<float>(values.begin() + first * row_width,
                              values.begin() + last * row_width);
  };
  const tensor first_input = tensor::from_host(*device, s, {split, width}, part(rows, 0, 5, width));
  const tensor second_input = tensor::from_host(*device, s, {2, width}, part(rows, 5, 7, width));
  forward_result first = cell->forward(options, first_input);
  forward_result second = cell->forward(options, second_input);
  const tensor second_gradient =
      tensor::from_host(*device, s, {2, 2 * hidden}, part(upstream, 5, 7, 2 * hidden));
  const tensor first_gradient =
      tensor::from_host(*device, s, {split, 2 * hidden}, part(upstream, 0, 5, 2 * hidden));
  std::vector<float> input_gradient =
      cell->backward(options, *first.context, first_gradient, true).to_host(s);
  const std::vector<float> second_input_gradient =
      cell->backward_input(options, *second.context, second_gradient, true).to_host(s);
  cell->backward_weights(options, *second.context);

  std::vector<float> output = first.output.to_host(s);
  const std::vector<float> second_output = second.output.to_host(s);
  output.insert(output.end(), second_output.begin(), second_output.end());
  input_gradient.insert(input_gradient.end(), second_input_gradient.begin(),
                        second_input_gradient.end());
  expect_near_all(output, whole.output, "output");
  expect_near_all(input_gradient, whole.input_gradient, "input gradient");
  const std::vector<parameter*> parameters = cell->parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    expect_near_all(parameters[i]->gradient.to_host(s), whole.parameter_gradients[i],
                    parameters[i]->name);
  }
}

TEST(LstmCellTest, AVisitOfNoRowsGivesNoRowsAndNoGradient) {
  auto device = testing::cpu_backend();
  const stream s = device->default_stream();
  const layer_spec spec = cell_spec(2);
  auto cell = make_layer(*device, s, spec, {input_width(spec)}, 3, 0);
  forward_result result =
      cell->forward(run_options{s}, tensor(*device, {0, int64_t(input_width(spec))}));
  EXPECT_EQ(result.output.dims(), (shape{0, 2 * hidden}));
  const tensor input_gradient =
      cell->backward(run_options{s}, *result.context, tensor(*device, {0, 2 * hidden}), true);
  EXPECT_EQ(input_gradient.dims(), (shape{0, int64_t(input_width(spec))}));
  for (parameter* p : cell->parameters()) EXPECT_FALSE(p->has_gradient) << p->name;
}

std::string shape_error(const layer_spec& spec, const shape& input) {
  shape output;
  std::string error;
  EXPECT_FALSE(infer_output_shape(spec, input, &output, &error)) << spec.type;
  return error;
}

TEST(LstmCellTest, ShapesThatDoNotFitGetAnErrorNamingTheRow) {
  shape output;
  std::string error;
  ASSERT_TRUE(infer_output_shape(cell_spec(0), {7}, &output, &error)) << error;
  EXPECT_EQ(output, (shape{2 * hidden}));
  ASSERT_TRUE(infer_output_shape(cell_spec(3), {19}, &output, &error)) << error;
  EXPECT_EQ(output, (shape{2 * hidden}));

  // No room for x: the states alone take 2 H (2 N H) features.
  const std::string lstm = shape_error(cell_spec(0), {6});
  EXPECT_NE(lstm.find("[x | h | c]"), std::string::npos) << lstm;
  EXPECT_NE(lstm.find("more than 6"), std::string::npos) << lstm;
  EXPECT_NE(lstm.find("got [6]"), std::string::npos) << lstm;
  const std::string tree = shape_error(cell_spec(2), {12});
  EXPECT_NE(tree.find("h_2 | c_2]"), std::string::npos) << tree;
  EXPECT_NE(tree.find("more than 12"), std::string::npos) << tree;
  // Rows, not sequences or images.
  EXPECT_NE(shape_error(cell_spec(0), {4, 7}).find("got [4, 7]"), std::string::npos);
  layer_spec no_hidden = cell_spec(0);
  no_hidden.out = 0;
  EXPECT_NE(shape_error(no_hidden, {7}).find("out"), std::string::npos);
  layer_spec no_children = cell_spec(1);
  no_children.arity = 0;
  EXPECT_NE(shape_error(no_children, {7}).find("arity"), std::string::npos);
}

TEST(LstmCellTest, WeightsComeFromTheSeedAlone) {
  // A partition that builds only the cell holds the weights of the whole model's cell.
  auto device = testing::cpu_backend();
  const stream s = device->default_stream();
  const std::vector<layer_spec> specs = {testing::layer_block("linear", 8), cell_spec(1)};
  sequential whole(*device, s, specs, {4}, 0, 2, 17);
  sequential cell_only(*device, s, specs, {4}, 1, 2, 17);
  sequential other_seed(*device, s, specs, {4}, 1, 2, 18);
  const std::vector<parameter*> expected = whole.at(1).parameters();
  const std::vector<parameter*> actual = cell_only.parameters();
  ASSERT_EQ(actual.size(), 2u);
  EXPECT_EQ(actual[0]->name, "weight");
  EXPECT_EQ(actual[1]->name, "bias");
  EXPECT_EQ(actual[0]->value.dims(), (shape{4 * hidden, 2 + hidden}));
  EXPECT_EQ(actual[1]->value.dims(), (shape{4 * hidden}));
  for (size_t i = 0; i < actual.size(); ++i) {
    const std::vector<float> values = actual[i]->value.to_host(s);
    EXPECT_EQ(values, expected[i]->value.to_host(s)) << actual[i]->name;
    EXPECT_NE(values, other_seed.parameters()[i]->value.to_host(s)) << actual[i]->name;
    // PyTorch's LSTMCell: U(-1/sqrt(H), 1/sqrt(H)).
    for (float v : values) EXPECT_LE(std::fabs(v), 1.0f / std::sqrt(float(hidden)));
  }
}

TEST(LstmCellTest, ParameterCountAndFlopsFollowTheWeight) {
  auto device = testing::cpu_backend();
  for (int children : {0, 2, 3}) {
    const layer_spec spec = cell_spec(children);
    const shape input = {input_width(spec)};
    auto cell = make_layer(*device, device->default_stream(), spec, input, 1, 0);
    int64_t values = 0;
    for (parameter* p : cell->parameters()) values += p->value.size();
    EXPECT_EQ(parameter_count(spec, input), values) << spec.type << " " << children;
    const int64_t weight = cell->parameters()[0]->value.size();
    EXPECT_DOUBLE_EQ(cell->forward_flops(10), 2.0 * 10 * double(weight));
  }
}

}  // namespace
}  // namespace troupe::layers
