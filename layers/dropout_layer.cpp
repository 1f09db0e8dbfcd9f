#include "layers/layer_kinds.h"
#include "layers/random.h"

namespace troupe::layers {
namespace {

struct dropout_context final : layer_context {
  tensor mask;
};

/// Inverted dropout: training zeroes each element with `probability` and scales the rest by
/// 1 / (1 - probability); evaluation passes the input through.
class dropout_layer final : public layer {
 public:
  dropout_layer(float probability, const shape& input, uint64_t layer_index)
      : layer(input, input), probability_(probability), layer_index_(layer_index) {}

  const char* type() const override { return "dropout"; }

  forward_result forward(const run_options& options, const tensor& input) override {
    auto context = std::make_unique<dropout_context>();
    if (options.mode != pass_mode::training || probability_ == 0.0f) {
      return {input, std::move(context)};
    }
    backend& device = input.device();
    tensor output(device, input.dims());
    context->mask = tensor(device, input.dims());
    const uint64_t offset = options.sample_offset * static_cast<uint64_t>(input.row_size());
    device.dropout_forward(options.work_stream, input.data(), output.data(), context->mask.data(),
                           input.size(), probability_, derive_seed(options.seed, layer_index_),
                           offset);
    return {output, std::move(context)};
  }

  tensor backward(const run_options& options, layer_context& context, const tensor& output_gradient,
                  bool need_input_gradient) override {
    if (!need_input_gradient) return tensor();
    const tensor& mask = static_cast<dropout_context&>(context).mask;
    if (mask.empty()) return output_gradient;
    mask.device().multiply(options.work_stream, output_gradient.data(), mask.data(),
                           output_gradient.data(), output_gradient.size());
    return output_gradient;
  }

 private:
  float probability_;
  uint64_t layer_index_;
};

}  // namespace

std::unique_ptr<layer> make_dropout_layer(const layer_spec& spec, const shape& input,
                                          uint64_t layer_index) {
  return std::make_unique<dropout_layer>(spec.probability, input, layer_index);
}

}  // namespace troupe::layers
