#include "layers/layer_kinds.h"

namespace troupe::layers {
namespace {

struct flatten_context final : layer_context {};

class flatten_layer final : public layer {
 public:
  flatten_layer(const shape& input, const shape& output) : layer(input, output) {}

  const char* type() const override { return "flatten"; }

  forward_result forward(const run_options&, const tensor& input) override {
    return {input.reshaped(batched(input.rows(), output_shape())),
            std::make_unique<flatten_context>()};
  }

  tensor backward(const run_options&, layer_context&, const tensor& output_gradient,
                  bool need_input_gradient) override {
    if (!need_input_gradient) return tensor();
    return output_gradient.reshaped(batched(output_gradient.rows(), input_shape()));
  }
};

}  // namespace

std::unique_ptr<layer> make_flatten_layer(const shape& input, const shape& output) {
  return std::make_unique<flatten_layer>(input, output);
}

}  // namespace troupe::layers
