#include <cmath>

#include "layers/layer_kinds.h"
#include "layers/random.h"

namespace troupe::layers {

parameter parameter_from_host(backend& device, stream s, const char* name, shape dims,
                              const std::vector<float>& values) {
  parameter result;
  result.name = name;
  result.value = tensor::from_host(device, s, dims, values);
  result.gradient = tensor(device, std::move(dims));
  return result;
}

parameter make_uniform_parameter(backend& device, stream s, const char* name, shape dims,
                                 float bound, random_generator& generator) {
  std::vector<float> values(element_count(dims));
  for (float& v : values) v = generator.uniform(-bound, bound);
  return parameter_from_host(device, s, name, std::move(dims), values);
}

initial_values initial_weight_rows(uint64_t seed, int64_t fan_in, int64_t out, bool bias,
                                   int64_t first, int64_t rows) {
  random_generator generator(seed);
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  initial_values result;
  // Every value is drawn, in the whole layer's order, so that a part keeps the whole's rows.
  for (int64_t i = 0; i < out * fan_in; ++i) {
    const float value = generator.uniform(-bound, bound);
    if (i >= first * fan_in && i < (first + rows) * fan_in) result.weight.push_back(value);
  }
  for (int64_t i = 0; bias && i < out; ++i) {
    const float value = generator.uniform(-bound, bound);
    if (i >= first && i < first + rows) result.bias.push_back(value);
  }
  return result;
}

void add_linear_weight_gradients(stream s, const float* output_gradient, const float* input,
                                 int input_stride, int rows, parameter& weight, parameter& bias) {
  backend& device = weight.gradient.device();
  const int outputs = static_cast<int>(weight.value.dims()[0]);
  const int inputs = static_cast<int>(weight.value.dims()[1]);
  device.gemm(s, transpose::yes, transpose::no, outputs, inputs, rows, 1.0f, output_gradient,
              outputs, input, input_stride, weight.accumulate_beta(), weight.gradient.data(),
              inputs);
  weight.has_gradient = true;
  if (!bias.value.empty()) {
    device.sum_rows(s, output_gradient, rows, outputs, bias.accumulate_beta(),
                    bias.gradient.data());
    bias.has_gradient = true;
  }
}

void stack_cut_output(backend& device, stream s, bool head, const float* input, int input_width,
                      int x_width, const float* own, int own_width, float* output, int rows) {
  // The head passes x on; the tail passes on the head's values, which follow x in its input.
  const float* first = head ? input : input + x_width;
  const int first_width = head ? x_width : input_width - x_width;
  const int width = first_width + own_width;
  device.copy_matrix(s, first, input_width, output, width, rows, first_width);
  device.copy_matrix(s, own, own_width, output + first_width, width, rows, own_width);
}

namespace {

struct linear_context final : layer_context {
  tensor input;
  tensor output_gradient;  ///< kept by backward_input() for backward_weights()
};

/// y = x W^T + b with W stored [out, in] as in PyTorch, over the last dimension of the input
/// (a [T, D] sample is T rows of D features, as nn.Linear treats it).
class linear_layer final : public layer {
 public:
  linear_layer(backend& device, stream s, const layer_spec& spec, const shape& input,
               const shape& output, uint64_t seed)
      : layer(input, output),
        inputs_(static_cast<int>(input.back())),
        outputs_(static_cast<int>(output.back())),
        rows_per_sample_(element_count(input) / input.back()),
        type_(spec.type == "lm_head" ? "lm_head" : "linear") {
    const initial_values values =
        initial_weight_rows(seed, inputs_, outputs_, spec.bias, 0, outputs_);
    weight_ = parameter_from_host(device, s, "weight", {outputs_, inputs_}, values.weight);
    if (spec.bias) bias_ = parameter_from_host(device, s, "bias", {outputs_}, values.bias);
  }

  const char* type() const override { return type_; }

  forward_result forward(const run_options& options, const tensor& input) override {
    backend& device = input.device();
    const int batch = static_cast<int>(input.size() / inputs_);
    tensor output(device, batched(input.rows(), output_shape()));
    device.gemm(options.work_stream, transpose::no, transpose::yes, batch, outputs_, inputs_, 1.0f,
                input.data(), inputs_, weight_.value.data(), inputs_, 0.0f, output.data(),
                outputs_);
    if (!bias_.value.empty()) {
      device.add_row_vector(options.work_stream, output.data(), bias_.value.data(), batch,
                            outputs_);
    }
    auto context = std::make_unique<linear_context>();
    if (options.mode == pass_mode::training) context->input = input;
    return {output, std::move(context)};
  }

  tensor backward(const run_options& options, layer_context& context, const tensor& output_gradient,
                  bool need_input_gradient) override {
    const tensor& input = static_cast<linear_context&>(context).input;
    add_weight_gradients(options.work_stream, input, output_gradient);
    if (!need_input_gradient) return tensor();
    return input_gradient(options.work_stream, input, output_gradient);
  }

  tensor backward_input(const run_options& options, layer_context& context,
                        const tensor& output_gradient, bool need_input_gradient) override {
    auto& saved = static_cast<linear_context&>(context);
    saved.output_gradient = output_gradient;
    if (!need_input_gradient) return tensor();
    return input_gradient(options.work_stream, saved.input, output_gradient);
  }

  bool splits_backward() const override { return true; }

  void backward_weights(const run_options& options, layer_context& context) override {
    auto& saved = static_cast<linear_context&>(context);
    add_weight_gradients(options.work_stream, saved.input, saved.output_gradient);
    saved.input = tensor();
    saved.output_gradient = tensor();
  }

  std::vector<parameter*> parameters() override {
    if (bias_.value.empty()) return {&weight_};
    return {&weight_, &bias_};
  }

  double forward_flops(int64_t batch) const override {
    return 2.0 * static_cast<double>(batch) * rows_per_sample_ * inputs_ * outputs_;
  }

 private:
  void add_weight_gradients(stream s, const tensor& input, const tensor& output_gradient) {
    add_linear_weight_gradients(s, output_gradient.data(), input.data(), inputs_,
                                static_cast<int>(input.size() / inputs_), weight_, bias_);
  }

  tensor input_gradient(stream s, const tensor& input, const tensor& output_gradient) {
    backend& device = input.device();
    const int batch = static_cast<int>(input.size() / inputs_);
    tensor result(device, input.dims());
    device.gemm(s, transpose::no, transpose::no, batch, inputs_, outputs_, 1.0f,
                output_gradient.data(), outputs_, weight_.value.data(), inputs_, 0.0f,
                result.data(), inputs_);
    return result;
  }

  int inputs_;
  int outputs_;
  int64_t rows_per_sample_;
  const char* type_;
  parameter weight_;
  parameter bias_;
};

}  // namespace

std::unique_ptr<layer> make_linear_layer(backend& device, stream s, const layer_spec& spec,
                                         const shape& input, const shape& output, uint64_t seed) {
  return std::make_unique<linear_layer>(device, s, spec, input, output, seed);
}

}  // namespace troupe::layers
