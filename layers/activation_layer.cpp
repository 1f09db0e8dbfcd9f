#include "layers/layer_kinds.h"

namespace troupe::layers {
namespace {

struct activation_context final : layer_context {
  tensor input;
  tensor output;
};

class activation_layer final : public layer {
 public:
  activation_layer(activation f, const shape& input) : layer(input, input), function_(f) {}

  const char* type() const override {
    switch (function_) {
      case activation::relu:
        return "relu";
      case activation::tanh:
        return "tanh";
      case activation::gelu:
        return "gelu";
    }
    return "activation";
  }

  forward_result forward(const run_options& options, const tensor& input) override {
    tensor output(input.device(), input.dims());
    input.device().activation_forward(options.work_stream, function_, input.data(), output.data(),
                                      input.size());
    auto context = std::make_unique<activation_context>();
    if (options.mode == pass_mode::training) {
      context->input = input;
      context->output = output;
    }
    return {output, std::move(context)};
  }

  tensor backward(const run_options& options, layer_context& context, const tensor& output_gradient,
                  bool need_input_gradient) override {
    if (!need_input_gradient) return tensor();
    auto& saved = static_cast<activation_context&>(context);
    // The incoming gradient is ours alone, so the input gradient overwrites it in place.
    saved.input.device().activation_backward(options.work_stream, function_, saved.input.data(),
                                             saved.output.data(), output_gradient.data(),
                                             output_gradient.data(), output_gradient.size());
    return output_gradient;
  }

 private:
  activation function_;
};

}  // namespace

std::unique_ptr<layer> make_activation_layer(activation f, const shape& input) {
  return std::make_unique<activation_layer>(f, input);
}

}  // namespace troupe::layers
