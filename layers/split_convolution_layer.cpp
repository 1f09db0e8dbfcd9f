// A convolution whose output channels two stages share, for partitions that cut inside it
// (actors/config/layer_cuts.h), as split_linear_layer.cpp does for a linear layer: the head
// computes channels [0, split) and sends its input on beside them (an image of C + split
// channels), the tail computes channels [split, out) from that input and puts the head's in
// front of them. Only convolutions that keep the image's size (stride 1, padding (k - 1) / 2)
// are cut, so that input and output channels stack into one image. Each part runs an ordinary
// convolution over its channels, whose weights are its rows of the whole layer's values.

#include "layers/check.h"
#include "layers/layer_kinds.h"

namespace troupe::layers {
namespace {

struct split_convolution_context final : layer_context {
  std::unique_ptr<layer_context> inner;
};

class split_convolution_layer final : public layer {
 public:
  split_convolution_layer(backend& device, stream s, const layer_spec& spec, const shape& input,
                          const shape& output, uint64_t seed)
      : layer(input, output),
        head_(spec.type == "conv2d_head"),
        split_(spec.split),
        channels_(input[0] - (head_ ? 0 : spec.split)),
        pixels_(input[1] * input[2]),
        rows_(head_ ? spec.split : spec.out - spec.split) {
    layer_spec part = spec;
    part.type = "conv2d";
    part.out = rows_;
    const shape image{channels_, input[1], input[2]};
    inner_ = make_convolution_layer(device, s, part, image, {rows_, input[1], input[2]}, seed);
    // The inner convolution's own draw gives way to this part's rows of the whole layer's.
    const initial_values values =
        initial_weight_rows(seed, channels_ * spec.kernel * spec.kernel, spec.out, spec.bias,
                            head_ ? 0 : spec.split, rows_);
    std::vector<parameter*> parameters = inner_->parameters();
    take_values(s, values.weight, parameters[0]);
    if (spec.bias) take_values(s, values.bias, parameters[1]);
  }

  const char* type() const override { return head_ ? "conv2d_head" : "conv2d_tail"; }

  forward_result forward(const run_options& options, const tensor& input) override {
    backend& device = input.device();
    const stream s = options.work_stream;
    const int batch = static_cast<int>(input.rows());
    const int in_width = static_cast<int>(input.row_size());
    const int x_width = static_cast<int>(channels_ * pixels_);
    const int own = static_cast<int>(rows_ * pixels_);
    tensor x = input;
    if (!head_) {
      x = tensor(device, {batch, channels_, input_shape()[1], input_shape()[2]});
      device.copy_matrix(s, input.data(), in_width, x.data(), x_width, batch, x_width);
    }
    auto context = std::make_unique<split_convolution_context>();
    forward_result inner = inner_->forward(options, x);
    context->inner = std::move(inner.context);
    tensor output(device, batched(input.rows(), output_shape()));
    // The head's [x | its channels]; the tail's [the head's channels | its channels] from
    // [x | the head's channels].
    stack_cut_output(device, s, head_, input.data(), in_width, x_width, inner.output.data(), own,
                     output.data(), batch);
    return {output, std::move(context)};
  }

  tensor backward(const run_options& options, layer_context& context, const tensor& output_gradient,
                  bool need_input_gradient) override {
    tensor result = backward_input(options, context, output_gradient, need_input_gradient);
    backward_weights(options, context);
    return result;
  }

  tensor backward_input(const run_options& options, layer_context& context,
                        const tensor& output_gradient, bool need_input_gradient) override {
    auto& saved = static_cast<split_convolution_context&>(context);
    backend& device = output_gradient.device();
    const stream s = options.work_stream;
    const int batch = static_cast<int>(output_gradient.rows());
    const int out_width = static_cast<int>(element_count(output_shape()));
    const int in_width = static_cast<int>(element_count(input_shape()));
    const int x_width = static_cast<int>(channels_ * pixels_);
    const int own = static_cast<int>(rows_ * pixels_);
    const int offset = head_ ? x_width : static_cast<int>(split_ * pixels_);
    // This part's channels of the gradient, as the inner convolution's output gradient.
    tensor own_gradient(device, {batch, rows_, input_shape()[1], input_shape()[2]});
    device.copy_matrix(s, output_gradient.data() + offset, out_width, own_gradient.data(), own,
                       batch, own);
    tensor dx =
        inner_->backward_input(options, *saved.inner, own_gradient, need_input_gradient || !head_);
    if (!need_input_gradient) return tensor();
    tensor result(device, batched(batch, input_shape()));
    if (head_) {
      // The gradient arrives as [dx from the tail | d channels]: dx = that + the inner one.
      device.copy_matrix(s, output_gradient.data(), out_width, result.data(), in_width, batch,
                         x_width);
      device.axpy(s, 1.0f, dx.data(), result.data(), static_cast<size_t>(batch) * x_width);
    } else {
      // [dx | the head's channels of the gradient], back to the head.
      const int head = static_cast<int>(split_ * pixels_);
      device.copy_matrix(s, dx.data(), x_width, result.data(), in_width, batch, x_width);
      device.copy_matrix(s, output_gradient.data(), out_width, result.data() + x_width, in_width,
                         batch, head);
    }
    return result;
  }

  bool splits_backward() const override { return true; }

  void backward_weights(const run_options& options, layer_context& context) override {
    auto& saved = static_cast<split_convolution_context&>(context);
    inner_->backward_weights(options, *saved.inner);
  }

  std::vector<parameter*> parameters() override { return inner_->parameters(); }

  double forward_flops(int64_t batch) const override { return inner_->forward_flops(batch); }

 private:
  /// Puts `values` into `target`, whose size they have.
  static void take_values(stream s, const std::vector<float>& values, parameter* target) {
    TROUPE_CHECK(target->value.size() == static_cast<int64_t>(values.size()));
    target->value.copy_from_host(s, values.data());
    target->value.device().synchronize(s);
  }

  bool head_;
  int64_t split_;     ///< channels the head computes
  int64_t channels_;  ///< of x, the layer's input
  int64_t pixels_;    ///< of one channel (the image keeps its size)
  int64_t rows_;      ///< channels this part computes
  std::unique_ptr<layer> inner_;
};

}  // namespace

std::unique_ptr<layer> make_split_convolution_layer(backend& device, stream s,
                                                    const layer_spec& spec, const shape& input,
                                                    const shape& output, uint64_t seed) {
  TROUPE_CHECK(spec.split > 0 && spec.split < spec.out);
  return std::make_unique<split_convolution_layer>(device, s, spec, input, output, seed);
}

}  // namespace troupe::layers
