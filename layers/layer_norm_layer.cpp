#include "layers/layer_kinds.h"

namespace troupe::layers {
namespace {

struct layer_norm_context final : layer_context {
  tensor normalized;
  tensor rstd;
};

/// PyTorch's nn.LayerNorm over the last dimension, epsilon 1e-5, weight 1 and bias 0 at first.
class layer_norm_layer final : public layer {
 public:
  layer_norm_layer(backend& device, stream s, const shape& input)
      : layer(input, input), width_(static_cast<int>(input.back())) {
    weight_.name = "weight";
    weight_.value = tensor::filled(device, s, {width_}, 1.0f);
    weight_.gradient = tensor(device, {width_});
    bias_.name = "bias";
    bias_.value = tensor::filled(device, s, {width_}, 0.0f);
    bias_.gradient = tensor(device, {width_});
  }

  const char* type() const override { return "layernorm"; }

  forward_result forward(const run_options& options, const tensor& input) override {
    backend& device = input.device();
    const int rows = static_cast<int>(input.size() / width_);
    tensor output(device, input.dims());
    auto context = std::make_unique<layer_norm_context>();
    context->normalized = tensor(device, input.dims());
    context->rstd = tensor(device, {rows});
    device.layer_norm_forward(options.work_stream, input.data(), weight_.value.data(),
                              bias_.value.data(), output.data(), context->normalized.data(),
                              context->rstd.data(), rows, width_, 1e-5f);
    if (options.mode != pass_mode::training) context.reset(new layer_norm_context);
    return {output, std::move(context)};
  }

  tensor backward(const run_options& options, layer_context& context, const tensor& output_gradient,
                  bool need_input_gradient) override {
    auto& saved = static_cast<layer_norm_context&>(context);
    backend& device = saved.normalized.device();
    const stream s = options.work_stream;
    const int rows = static_cast<int>(output_gradient.size() / width_);
    tensor scaled(device, output_gradient.dims());
    device.multiply(s, output_gradient.data(), saved.normalized.data(), scaled.data(),
                    scaled.size());
    device.sum_rows(s, scaled.data(), rows, width_, weight_.accumulate_beta(),
                    weight_.gradient.data());
    device.sum_rows(s, output_gradient.data(), rows, width_, bias_.accumulate_beta(),
                    bias_.gradient.data());
    weight_.has_gradient = bias_.has_gradient = true;
    if (!need_input_gradient) return tensor();
    device.layer_norm_backward(s, output_gradient.data(), weight_.value.data(),
                               saved.normalized.data(), saved.rstd.data(), scaled.data(), rows,
                               width_);
    return scaled;
  }

  std::vector<parameter*> parameters() override { return {&weight_, &bias_}; }

 private:
  int width_;
  parameter weight_;
  parameter bias_;
};

}  // namespace

std::unique_ptr<layer> make_layer_norm_layer(backend& device, stream s, const shape& input) {
  return std::make_unique<layer_norm_layer>(device, s, input);
}

}  // namespace troupe::layers
