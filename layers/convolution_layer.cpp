#include "layers/layer_kinds.h"

namespace troupe::layers {
namespace {

struct convolution_context final : layer_context {
  tensor columns;  // im2col of the input: [batch * out_height * out_width, channels * k * k]
  int64_t batch = 0;
  // Kept by backward_input() for backward_weights(): the output gradient, and as NHWC rows.
  tensor output_gradient;
  tensor gradient_rows;
};

/// A 2-D convolution over NCHW images by im2col + GEMM. The weight is [out, in, k, k] as in
/// PyTorch; the GEMM produces NHWC rows, which one transpose turns into NCHW.
class convolution_layer final : public layer {
 public:
  convolution_layer(backend& device, stream s, const layer_spec& spec, const shape& input,
                    const shape& output, uint64_t seed)
      : layer(input, output) {
    geometry_.channels = static_cast<int>(input[0]);
    geometry_.height = static_cast<int>(input[1]);
    geometry_.width = static_cast<int>(input[2]);
    geometry_.kernel = spec.kernel;
    geometry_.stride = spec.stride > 0 ? spec.stride : 1;
    geometry_.padding = spec.padding;
    geometry_.out_height = static_cast<int>(output[1]);
    geometry_.out_width = static_cast<int>(output[2]);
    out_channels_ = spec.out;
    patch_ = geometry_.channels * spec.kernel * spec.kernel;
    const initial_values values =
        initial_weight_rows(seed, patch_, out_channels_, spec.bias, 0, out_channels_);
    weight_ = parameter_from_host(device, s, "weight",
                                  {out_channels_, geometry_.channels, spec.kernel, spec.kernel},
                                  values.weight);
    if (spec.bias) bias_ = parameter_from_host(device, s, "bias", {out_channels_}, values.bias);
  }

  const char* type() const override { return "conv2d"; }

  forward_result forward(const run_options& options, const tensor& input) override {
    backend& device = input.device();
    const stream s = options.work_stream;
    const convolution_geometry g = geometry_for(input.rows());
    const int pixels = g.out_height * g.out_width;
    const int rows = g.batch * pixels;
    auto context = std::make_unique<convolution_context>();
    context->batch = input.rows();
    context->columns = tensor(device, {rows, patch_});
    device.im2col(s, g, input.data(), context->columns.data());
    tensor rows_by_channel(device, {rows, out_channels_});
    device.gemm(s, transpose::no, transpose::yes, rows, out_channels_, patch_, 1.0f,
                context->columns.data(), patch_, weight_.value.data(), patch_, 0.0f,
                rows_by_channel.data(), out_channels_);
    tensor output(device, batched(input.rows(), output_shape()));
    device.transpose_batched(s, rows_by_channel.data(), output.data(), g.batch, pixels,
                             out_channels_);
    if (!bias_.value.empty()) {
      device.add_channel_vector(s, output.data(), bias_.value.data(), g.batch, out_channels_,
                                pixels);
    }
    if (options.mode != pass_mode::training) context->columns = tensor();
    return {output, std::move(context)};
  }

  tensor backward(const run_options& options, layer_context& context, const tensor& output_gradient,
                  bool need_input_gradient) override {
    auto& saved = static_cast<convolution_context&>(context);
    const stream s = options.work_stream;
    const tensor gradient_rows = rows_of(s, saved.batch, output_gradient);
    add_weight_gradients(s, saved, output_gradient, gradient_rows);
    if (!need_input_gradient) return tensor();
    // The saved columns are not needed any more: their memory takes the column gradient.
    return input_gradient(s, saved.batch, gradient_rows, saved.columns);
  }

  tensor backward_input(const run_options& options, layer_context& context,
                        const tensor& output_gradient, bool need_input_gradient) override {
    auto& saved = static_cast<convolution_context&>(context);
    const stream s = options.work_stream;
    saved.output_gradient = output_gradient;
    saved.gradient_rows = rows_of(s, saved.batch, output_gradient);
    if (!need_input_gradient) return tensor();
    // The columns wait for backward_weights(): the column gradient takes memory of its own.
    tensor column_gradient(output_gradient.device(), saved.columns.dims());
    return input_gradient(s, saved.batch, saved.gradient_rows, column_gradient);
  }

  bool splits_backward() const override { return true; }

  void backward_weights(const run_options& options, layer_context& context) override {
    auto& saved = static_cast<convolution_context&>(context);
    add_weight_gradients(options.work_stream, saved, saved.output_gradient, saved.gradient_rows);
    saved = convolution_context();
  }

  std::vector<parameter*> parameters() override {
    if (bias_.value.empty()) return {&weight_};
    return {&weight_, &bias_};
  }

  double forward_flops(int64_t batch) const override {
    return 2.0 * static_cast<double>(batch) * geometry_.out_height * geometry_.out_width * patch_ *
           out_channels_;
  }

 private:
  convolution_geometry geometry_for(int64_t batch) const {
    convolution_geometry g = geometry_;
    g.batch = static_cast<int>(batch);
    return g;
  }

  /// The output gradient [batch, out, h, w] as rows [batch * h * w, out].
  tensor rows_of(stream s, int64_t batch, const tensor& output_gradient) const {
    const convolution_geometry g = geometry_for(batch);
    const int pixels = g.out_height * g.out_width;
    tensor rows(output_gradient.device(), {g.batch * pixels, out_channels_});
    output_gradient.device().transpose_batched(s, output_gradient.data(), rows.data(), g.batch,
                                               out_channels_, pixels);
    return rows;
  }

  void add_weight_gradients(stream s, const convolution_context& saved,
                            const tensor& output_gradient, const tensor& gradient_rows) {
    backend& device = output_gradient.device();
    const convolution_geometry g = geometry_for(saved.batch);
    const int pixels = g.out_height * g.out_width;
    device.gemm(s, transpose::yes, transpose::no, out_channels_, patch_, g.batch * pixels, 1.0f,
                gradient_rows.data(), out_channels_, saved.columns.data(), patch_,
                weight_.accumulate_beta(), weight_.gradient.data(), patch_);
    weight_.has_gradient = true;
    if (!bias_.value.empty()) {
      device.sum_channels(s, output_gradient.data(), g.batch, out_channels_, pixels,
                          bias_.accumulate_beta(), bias_.gradient.data());
      bias_.has_gradient = true;
    }
  }

  /// The input gradient from the output gradient's rows, through `column_gradient` (a
  /// [rows, patch] tensor it overwrites).
  tensor input_gradient(stream s, int64_t batch, const tensor& gradient_rows,
                        tensor& column_gradient) const {
    backend& device = gradient_rows.device();
    const convolution_geometry g = geometry_for(batch);
    device.gemm(s, transpose::no, transpose::no, g.batch * g.out_height * g.out_width, patch_,
                out_channels_, 1.0f, gradient_rows.data(), out_channels_, weight_.value.data(),
                patch_, 0.0f, column_gradient.data(), patch_);
    tensor result(device, batched(batch, input_shape()));
    device.col2im(s, g, column_gradient.data(), result.data());
    return result;
  }

  convolution_geometry geometry_;
  int out_channels_ = 0;
  int patch_ = 0;
  parameter weight_;
  parameter bias_;
};

}  // namespace

std::unique_ptr<layer> make_convolution_layer(backend& device, stream s, const layer_spec& spec,
                                              const shape& input, const shape& output,
                                              uint64_t seed) {
  return std::make_unique<convolution_layer>(device, s, spec, input, output, seed);
}

}  // namespace troupe::layers
