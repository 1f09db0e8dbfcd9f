// A linear layer whose outputs two stages share, for partitions that cut inside a large layer
// (actors/config/layer_cuts.h): the head computes outputs [0, split) and sends its input on
// beside them; the tail computes outputs [split, out) from that input and puts the head's in
// front of them. Together they compute y = x W^T + b as one linear layer does, with the same
// weights: both draw the whole layer's values from the layer's seed and keep their rows.
// The head's output row is [x | its outputs], the tail's input row the same.

#include "layers/check.h"
#include "layers/layer_kinds.h"

namespace troupe::layers {
namespace {

struct split_linear_context final : layer_context {
  tensor input;            ///< the head's x; the tail's whole input (x, then the head's rows)
  tensor output_gradient;  ///< kept by backward_input() for backward_weights()
};

class split_linear_layer final : public layer {
 public:
  split_linear_layer(backend& device, stream s, const layer_spec& spec, const shape& input,
                     const shape& output, uint64_t seed)
      : layer(input, output),
        head_(spec.type == "linear_head"),
        outputs_(spec.out),
        split_(spec.split),
        inputs_(static_cast<int>(head_ ? input.back() : input.back() - spec.split)),
        first_row_(head_ ? 0 : spec.split),
        rows_(head_ ? spec.split : spec.out - spec.split),
        rows_per_sample_(element_count(input) / input.back()) {
    const initial_values values =
        initial_weight_rows(seed, inputs_, outputs_, spec.bias, first_row_, rows_);
    weight_ = parameter_from_host(device, s, "weight", {rows_, inputs_}, values.weight);
    if (spec.bias) bias_ = parameter_from_host(device, s, "bias", {rows_}, values.bias);
  }

  const char* type() const override { return head_ ? "linear_head" : "linear_tail"; }

  forward_result forward(const run_options& options, const tensor& input) override {
    backend& device = input.device();
    const stream s = options.work_stream;
    const int batch = batch_of(input);
    tensor output(device, batched(input.rows(), output_shape()));
    tensor rows(device, {batch, rows_});
    device.gemm(s, transpose::no, transpose::yes, batch, rows_, inputs_, 1.0f, input.data(),
                input_stride(), weight_.value.data(), inputs_, 0.0f, rows.data(), rows_);
    if (!bias_.value.empty()) {
      device.add_row_vector(s, rows.data(), bias_.value.data(), batch, rows_);
    }
    // The head's [x | x Wa^T + ba]; the tail's [ya | x Wb^T + bb] from [x | ya].
    stack_cut_output(device, s, head_, input.data(), input_stride(), inputs_, rows.data(), rows_,
                     output.data(), batch);
    auto context = std::make_unique<split_linear_context>();
    if (options.mode == pass_mode::training) context->input = input;
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
    auto& saved = static_cast<split_linear_context&>(context);
    backend& device = output_gradient.device();
    const stream s = options.work_stream;
    const int batch = batch_of(saved.input);
    const int width = output_shape().back();
    // This part's rows of the gradient, contiguous.
    tensor rows(device, {batch, rows_});
    device.copy_matrix(s, output_gradient.data() + (head_ ? inputs_ : split_), width, rows.data(),
                       rows_, batch, rows_);
    saved.output_gradient = rows;
    if (!need_input_gradient) return tensor();
    tensor result(device, saved.input.dims());
    if (head_) {
      // The gradient arrives as [dx from the tail | d rows]: dx = that + d rows · Wa.
      device.copy_matrix(s, output_gradient.data(), width, result.data(), inputs_, batch, inputs_);
      device.gemm(s, transpose::no, transpose::no, batch, inputs_, rows_, 1.0f, rows.data(), rows_,
                  weight_.value.data(), inputs_, 1.0f, result.data(), inputs_);
    } else {
      // [d rows · Wb | the head's rows of the gradient], back to the head.
      device.gemm(s, transpose::no, transpose::no, batch, inputs_, rows_, 1.0f, rows.data(), rows_,
                  weight_.value.data(), inputs_, 0.0f, result.data(), input_stride());
      device.copy_matrix(s, output_gradient.data(), width, result.data() + inputs_, input_stride(),
                         batch, split_);
    }
    return result;
  }

  bool splits_backward() const override { return true; }

  void backward_weights(const run_options& options, layer_context& context) override {
    auto& saved = static_cast<split_linear_context&>(context);
    add_linear_weight_gradients(options.work_stream, saved.output_gradient.data(),
                                saved.input.data(), input_stride(), batch_of(saved.input), weight_,
                                bias_);
    saved.input = tensor();
    saved.output_gradient = tensor();
  }

  std::vector<parameter*> parameters() override {
    if (bias_.value.empty()) return {&weight_};
    return {&weight_, &bias_};
  }

  double forward_flops(int64_t batch) const override {
    return 2.0 * static_cast<double>(batch) * rows_per_sample_ * inputs_ * rows_;
  }

 private:
  /// Floats between two rows of x in the input: the tail's rows hold the head's outputs too.
  int input_stride() const { return head_ ? inputs_ : inputs_ + split_; }
  /// Rows of x in `input` (samples times rows per sample).
  int batch_of(const tensor& input) const {
    return static_cast<int>(input.size() / input_stride());
  }

  bool head_;
  int outputs_;  ///< the whole layer's
  int split_;    ///< outputs the head computes
  int inputs_;
  int first_row_;
  int rows_;  ///< outputs this part computes
  int64_t rows_per_sample_;
  parameter weight_;
  parameter bias_;
};

}  // namespace

std::unique_ptr<layer> make_split_linear_layer(backend& device, stream s, const layer_spec& spec,
                                               const shape& input, const shape& output,
                                               uint64_t seed) {
  TROUPE_CHECK(spec.split > 0 && spec.split < spec.out);
  return std::make_unique<split_linear_layer>(device, s, spec, input, output, seed);
}

}  // namespace troupe::layers
