// LSTM cells over rows, for a model graph's loop and tree routes (actors/config/model_graph.h):
// PyTorch's LSTMCell (lstm_cell) and Tai et al. 2015's N-ary Tree-LSTM (tree_lstm_cell). They
// are one layer: an LSTMCell is the N-ary cell with one child. A row is [x | h_1 | c_1 | ... |
// h_N | c_N]; all gates come from one GEMM, gates = W [x | h_1 .. h_N] + b with W stored
// [(3 + N) H, X + N H] as PyTorch stores a linear layer's, in the order i, f_1 .. f_N, u, o
// (LSTMCell's i, f, g, o when N = 1); each row's output is [h | c].

#include <cmath>

#include "layers/layer_kinds.h"
#include "layers/random.h"

namespace troupe::layers {
namespace {

struct lstm_cell_context final : layer_context {
  tensor input;
  /// [x | h_1 .. h_N] gathered out of the input rows; empty with one child, whose [x | h] leads
  /// every input row.
  tensor gathered;
  tensor gates;  ///< after their activations
  tensor output;
  tensor gate_gradient;  ///< kept by backward_input() for backward_weights()
};

class lstm_cell_layer final : public layer {
 public:
  lstm_cell_layer(backend& device, stream s, const layer_spec& spec, const shape& input,
                  const shape& output, uint64_t seed)
      : layer(input, output), tree_(spec.type == "tree_lstm_cell") {
    geometry_.hidden = spec.out;
    geometry_.children = tree_ ? spec.arity : 1;
    geometry_.x_width = static_cast<int>(input.back()) - 2 * geometry_.children * spec.out;
    // PyTorch's LSTMCell draws every value from U(-1/sqrt(H), 1/sqrt(H)).
    random_generator generator(seed);
    const float bound = 1.0f / std::sqrt(static_cast<float>(spec.out));
    weight_ = make_uniform_parameter(device, s, "weight", {geometry_.gate_width(), gemm_width()},
                                     bound, generator);
    if (spec.bias) {
      bias_ = make_uniform_parameter(device, s, "bias", {geometry_.gate_width()}, bound, generator);
    }
  }

  const char* type() const override { return tree_ ? "tree_lstm_cell" : "lstm_cell"; }

  forward_result forward(const run_options& options, const tensor& input) override {
    backend& device = input.device();
    const stream s = options.work_stream;
    const lstm_cell_geometry g = geometry_of(input.rows());
    tensor output(device, batched(g.rows, output_shape()));
    auto context = std::make_unique<lstm_cell_context>();
    if (g.rows == 0) return {output, std::move(context)};
    tensor gathered = gather(s, input);
    tensor gates(device, {g.rows, g.gate_width()});
    device.gemm(s, transpose::no, transpose::yes, g.rows, g.gate_width(), gemm_width(), 1.0f,
                gemm_rows(input, gathered), gemm_stride(), weight_.value.data(), gemm_width(), 0.0f,
                gates.data(), g.gate_width());
    if (!bias_.value.empty()) {
      device.add_row_vector(s, gates.data(), bias_.value.data(), g.rows, g.gate_width());
    }
    device.lstm_cell_forward(s, g, gates.data(), input.data(), output.data());
    if (options.mode == pass_mode::training) {
      context->input = input;
      context->gathered = gathered;
      context->gates = gates;
      context->output = output;
    }
    return {output, std::move(context)};
  }

  tensor backward(const run_options& options, layer_context& context, const tensor& output_gradient,
                  bool need_input_gradient) override {
    tensor input_gradient = backward_input(options, context, output_gradient, need_input_gradient);
    backward_weights(options, context);
    return input_gradient;
  }

  tensor backward_input(const run_options& options, layer_context& context,
                        const tensor& output_gradient, bool need_input_gradient) override {
    auto& saved = static_cast<lstm_cell_context&>(context);
    backend& device = output_gradient.device();
    const stream s = options.work_stream;
    const lstm_cell_geometry g = geometry_of(output_gradient.rows());
    tensor input_gradient;
    if (need_input_gradient) input_gradient = tensor(device, batched(g.rows, input_shape()));
    if (g.rows == 0) return input_gradient;
    saved.gate_gradient = tensor(device, {g.rows, g.gate_width()});
    device.lstm_cell_backward(s, g, saved.gates.data(), saved.input.data(), saved.output.data(),
                              output_gradient.data(), saved.gate_gradient.data(),
                              need_input_gradient ? input_gradient.data() : nullptr);
    if (need_input_gradient) add_gemm_input_gradient(s, saved.gate_gradient, input_gradient);
    return input_gradient;
  }

  void backward_weights(const run_options& options, layer_context& context) override {
    auto& saved = static_cast<lstm_cell_context&>(context);
    if (!saved.gate_gradient.empty()) {
      add_linear_weight_gradients(options.work_stream, saved.gate_gradient.data(),
                                  gemm_rows(saved.input, saved.gathered), gemm_stride(),
                                  static_cast<int>(saved.gate_gradient.rows()), weight_, bias_);
    }
    saved = {};  // the instance's backward is done
  }

  bool splits_backward() const override { return true; }

  std::vector<parameter*> parameters() override {
    if (bias_.value.empty()) return {&weight_};
    return {&weight_, &bias_};
  }

  double forward_flops(int64_t batch) const override {
    return 2.0 * static_cast<double>(batch) * geometry_.gate_width() * gemm_width();
  }

 private:
  /// Columns of the GEMM's input: x and every child's h.
  int gemm_width() const { return geometry_.x_width + geometry_.children * geometry_.hidden; }
  int gemm_stride() const {
    return geometry_.children == 1 ? geometry_.input_width() : gemm_width();
  }
  const float* gemm_rows(const tensor& input, const tensor& gathered) const {
    return geometry_.children == 1 ? input.data() : gathered.data();
  }

  lstm_cell_geometry geometry_of(int64_t rows) const {
    lstm_cell_geometry g = geometry_;
    g.rows = static_cast<int>(rows);
    return g;
  }

  /// The column blocks of [x | h_1 .. h_N] in an input row, as (input column, gathered
  /// column, width), x first.
  template <typename Function>
  void for_each_gemm_block(const Function& f) const {
    const int x = geometry_.x_width, hidden = geometry_.hidden;
    f(0, 0, x);
    for (int k = 0; k < geometry_.children; ++k) f(x + 2 * k * hidden, x + k * hidden, hidden);
  }

  /// [x | h_1 .. h_N] copied out of the input rows (nothing with one child).
  tensor gather(stream s, const tensor& input) const {
    if (geometry_.children == 1) return tensor();
    tensor gathered(input.device(), {input.rows(), gemm_width()});
    const int rows = static_cast<int>(input.rows());
    for_each_gemm_block([&](int from, int to, int width) {
      input.device().copy_matrix(s, input.data() + from, geometry_.input_width(),
                                 gathered.data() + to, gemm_width(), rows, width);
    });
    return gathered;
  }

  /// Writes d[x | h_1 .. h_N] = gate_gradient W into its columns of `input_gradient`.
  void add_gemm_input_gradient(stream s, const tensor& gate_gradient,
                               tensor& input_gradient) const {
    backend& device = input_gradient.device();
    const int rows = static_cast<int>(gate_gradient.rows());
    const bool direct = geometry_.children == 1;
    tensor gathered = direct ? tensor() : tensor(device, {rows, gemm_width()});
    float* target = direct ? input_gradient.data() : gathered.data();
    device.gemm(s, transpose::no, transpose::no, rows, gemm_width(), geometry_.gate_width(), 1.0f,
                gate_gradient.data(), geometry_.gate_width(), weight_.value.data(), gemm_width(),
                0.0f, target, gemm_stride());
    if (direct) return;
    for_each_gemm_block([&](int to, int from, int width) {
      device.copy_matrix(s, gathered.data() + from, gemm_width(), input_gradient.data() + to,
                         geometry_.input_width(), rows, width);
    });
  }

  bool tree_;
  lstm_cell_geometry geometry_;
  parameter weight_;
  parameter bias_;
};

}  // namespace

std::unique_ptr<layer> make_lstm_cell_layer(backend& device, stream s, const layer_spec& spec,
                                            const shape& input, const shape& output,
                                            uint64_t seed) {
  return std::make_unique<lstm_cell_layer>(device, s, spec, input, output, seed);
}

}  // namespace troupe::layers
