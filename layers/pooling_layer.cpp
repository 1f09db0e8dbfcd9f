#include "layers/layer_kinds.h"

namespace troupe::layers {
namespace {

struct pooling_context final : layer_context {
  int_tensor argmax;
  int64_t batch = 0;
};

class pooling_layer final : public layer {
 public:
  pooling_layer(const layer_spec& spec, const shape& input, const shape& output)
      : layer(input, output) {
    geometry_.channels = static_cast<int>(input[0]);
    geometry_.height = static_cast<int>(input[1]);
    geometry_.width = static_cast<int>(input[2]);
    geometry_.kernel = spec.kernel > 0 ? spec.kernel : 2;
    geometry_.stride = spec.stride > 0 ? spec.stride : geometry_.kernel;
    geometry_.out_height = static_cast<int>(output[1]);
    geometry_.out_width = static_cast<int>(output[2]);
  }

  const char* type() const override { return "maxpool2d"; }

  forward_result forward(const run_options& options, const tensor& input) override {
    backend& device = input.device();
    pooling_geometry g = geometry_;
    g.batch = static_cast<int>(input.rows());
    tensor output(device, batched(input.rows(), output_shape()));
    auto context = std::make_unique<pooling_context>();
    context->batch = input.rows();
    context->argmax = int_tensor(device, output.size());
    device.max_pool_forward(options.work_stream, g, input.data(), output.data(),
                            context->argmax.data());
    return {output, std::move(context)};
  }

  tensor backward(const run_options& options, layer_context& context, const tensor& output_gradient,
                  bool need_input_gradient) override {
    if (!need_input_gradient) return tensor();
    auto& saved = static_cast<pooling_context&>(context);
    backend& device = output_gradient.device();
    pooling_geometry g = geometry_;
    g.batch = static_cast<int>(saved.batch);
    tensor input_gradient(device, batched(saved.batch, input_shape()));
    device.max_pool_backward(options.work_stream, g, output_gradient.data(), saved.argmax.data(),
                             input_gradient.data());
    return input_gradient;
  }

 private:
  pooling_geometry geometry_;
};

}  // namespace

std::unique_ptr<layer> make_pooling_layer(const layer_spec& spec, const shape& input,
                                          const shape& output) {
  return std::make_unique<pooling_layer>(spec, input, output);
}

}  // namespace troupe::layers
