#include <cmath>

#include "layers/layer_kinds.h"
#include "layers/random.h"

namespace troupe::layers {
namespace {

/// Causal multi-head self-attention over a [B, T, 3D] tensor of queries, keys and values (the
/// output of attn.c_attn, heads side by side in each third, as nanoGPT lays them out). Every
/// product is a GEMM batched over the heads, read in place through row strides: no copies
/// into per-head layouts.
class causal_attention {
 public:
  causal_attention(int length, int width, int heads)
      : t_(length),
        d_(width),
        h_(heads),
        hd_(width / heads),
        scale_(1.0f / std::sqrt(static_cast<float>(width / heads))) {}

  /// y [B, T, D]; `probabilities` [B, H, T, T] is kept for the backward pass.
  void forward(stream s, const tensor& qkv, tensor* probabilities, tensor* y) const {
    backend& device = qkv.device();
    const int batch = static_cast<int>(qkv.rows());
    *probabilities = tensor(device, {batch, h_, t_, t_});
    *y = tensor(device, {batch, t_, d_});
    const int64_t square = int64_t(t_) * t_;
    for (int b = 0; b < batch; ++b) {
      const float* q = qkv.data() + int64_t(b) * t_ * 3 * d_;
      float* p = probabilities->data() + int64_t(b) * h_ * square;
      device.gemm_batched(s, transpose::no, transpose::yes, t_, t_, hd_, 1.0f, q, 3 * d_, hd_,
                          q + d_, 3 * d_, hd_, 0.0f, p, t_, square, h_);
    }
    device.causal_softmax_forward(s, probabilities->data(), probabilities->data(), batch * h_, t_,
                                  scale_);
    for (int b = 0; b < batch; ++b) {
      const float* v = qkv.data() + int64_t(b) * t_ * 3 * d_ + 2 * d_;
      const float* p = probabilities->data() + int64_t(b) * h_ * square;
      device.gemm_batched(s, transpose::no, transpose::no, t_, hd_, t_, 1.0f, p, t_, square, v,
                          3 * d_, hd_, 0.0f, y->data() + int64_t(b) * t_ * d_, d_, hd_, h_);
    }
  }

  /// The gradient of the [B, T, 3D] input from that of y.
  tensor backward(stream s, const tensor& qkv, const tensor& probabilities,
                  const tensor& dy) const {
    backend& device = qkv.device();
    const int batch = static_cast<int>(qkv.rows());
    const int64_t square = int64_t(t_) * t_;
    const int64_t sample = int64_t(t_) * 3 * d_;
    tensor dqkv(device, qkv.dims());
    tensor dp(device, probabilities.dims());
    for (int b = 0; b < batch; ++b) {
      const float* v = qkv.data() + b * sample + 2 * d_;
      const float* grad = dy.data() + int64_t(b) * t_ * d_;
      const float* p = probabilities.data() + b * h_ * square;
      // dP = dY V^T and dV = P^T dY, head by head.
      device.gemm_batched(s, transpose::no, transpose::yes, t_, t_, hd_, 1.0f, grad, d_, hd_, v,
                          3 * d_, hd_, 0.0f, dp.data() + b * h_ * square, t_, square, h_);
      device.gemm_batched(s, transpose::yes, transpose::no, t_, hd_, t_, 1.0f, p, t_, square, grad,
                          d_, hd_, 0.0f, dqkv.data() + b * sample + 2 * d_, 3 * d_, hd_, h_);
    }
    device.softmax_backward(s, probabilities.data(), dp.data(), dp.data(), batch * h_ * t_, t_,
                            scale_);
    for (int b = 0; b < batch; ++b) {
      const float* q = qkv.data() + b * sample;
      const float* ds = dp.data() + b * h_ * square;
      // dQ = dS K and dK = dS^T Q.
      device.gemm_batched(s, transpose::no, transpose::no, t_, hd_, t_, 1.0f, ds, t_, square,
                          q + d_, 3 * d_, hd_, 0.0f, dqkv.data() + b * sample, 3 * d_, hd_, h_);
      device.gemm_batched(s, transpose::yes, transpose::no, t_, hd_, t_, 1.0f, ds, t_, square, q,
                          3 * d_, hd_, 0.0f, dqkv.data() + b * sample + d_, 3 * d_, hd_, h_);
    }
    return dqkv;
  }

  /// Multiply-adds of both products, doubled: FLOPs of one sample's forward pass.
  double flops_per_sample() const { return 4.0 * t_ * t_ * d_; }

 private:
  int t_, d_, h_, hd_;
  float scale_;
};

/// The parts of the block, in the order of the forward pass.
enum part : size_t {
  ln_1,
  c_attn,
  attn_proj,
  attn_drop,
  ln_2,
  c_fc,
  gelu,
  mlp_proj,
  mlp_drop,
  parts
};

struct block_context final : layer_context {
  tensor input;
  std::vector<std::unique_ptr<layer_context>> parts;
  tensor qkv;
  tensor probabilities;
  bool complete = false;  ///< false under recompute until the backward pass rebuilds it
};

/// A GPT-2 block: x + attn(ln_1(x)), then + mlp(ln_2(.)), with a GELU MLP of mlp_ratio times
/// the width and dropout on both residual branches. Built from the library's own layers, whose
/// parameters take nanoGPT's names (ln_1.weight, attn.c_attn.weight, mlp.c_fc.weight, ...), so
/// the block's tensors load into a PyTorch module by name.
class transformer_block final : public layer {
 public:
  transformer_block(backend& device, stream s, const layer_spec& spec, const shape& input,
                    uint64_t seed, uint64_t layer_index)
      : layer(input, input),
        attention_(static_cast<int>(input[0]), static_cast<int>(input[1]), spec.heads),
        dropout_(spec.dropout) {
    const int width = static_cast<int>(input[1]);
    auto linear = [&](int out, uint64_t purpose) {
      layer_spec inner;
      inner.type = "linear";
      inner.out = out;
      const shape from = {input[0], purpose == mlp_proj ? int64_t(width) * spec.mlp_ratio : width};
      return make_linear_layer(device, s, inner, from, {input[0], out}, derive_seed(seed, purpose));
    };
    auto dropout = [&](uint64_t purpose) {
      layer_spec inner;
      inner.type = "dropout";
      inner.probability = spec.dropout;
      // Streams of their own, apart from those of top-level dropout blocks.
      return make_dropout_layer(inner, input, derive_seed(layer_index, purpose) | (1ull << 63));
    };
    const shape wide = {input[0], int64_t(width) * spec.mlp_ratio};
    layers_.resize(parts);
    layers_[ln_1] = make_layer_norm_layer(device, s, input);
    layers_[c_attn] = linear(3 * width, c_attn);
    layers_[attn_proj] = linear(width, attn_proj);
    layers_[attn_drop] = dropout(attn_drop);
    layers_[ln_2] = make_layer_norm_layer(device, s, input);
    layers_[c_fc] = linear(width * spec.mlp_ratio, c_fc);
    layers_[gelu] = make_activation_layer(activation::gelu, wide);
    layers_[mlp_proj] = linear(width, mlp_proj);
    layers_[mlp_drop] = dropout(mlp_drop);
    const char* prefixes[parts] = {
        "ln_1.", "attn.c_attn.", "attn.c_proj.", "", "ln_2.", "mlp.c_fc.", "", "mlp.c_proj.", ""};
    for (size_t i = 0; i < parts; ++i) {
      for (parameter* p : layers_[i]->parameters()) {
        p->name = prefixes[i] + p->name;
        parameters_.push_back(p);
      }
    }
  }

  const char* type() const override { return "transformer_block"; }

  forward_result forward(const run_options& options, const tensor& input) override {
    auto context = std::make_unique<block_context>();
    tensor output = run_forward(options, input, context.get());
    if (options.mode != pass_mode::training) return {output, std::make_unique<block_context>()};
    if (options.recompute) {
      // Keep the input alone; the backward pass runs the forward again (the dropout masks
      // are counter-based, so it draws the same ones).
      context = std::make_unique<block_context>();
      context->input = input;
    }
    return {output, std::move(context)};
  }

  tensor backward(const run_options& options, layer_context& context, const tensor& output_gradient,
                  bool need_input_gradient) override {
    auto& saved = static_cast<block_context&>(context);
    if (!saved.complete) run_forward(options, saved.input, &saved);
    backend& device = output_gradient.device();
    const stream s = options.work_stream;
    // The residual branches each take their own copy where dropout would overwrite it.
    auto branch = [&](const tensor& gradient) {
      return dropout_ > 0.0f ? gradient.clone(s) : gradient;
    };
    tensor grad = backward_part(options, saved, mlp_drop, branch(output_gradient));
    for (size_t i : {mlp_proj, gelu, c_fc, ln_2}) grad = backward_part(options, saved, i, grad);
    device.axpy(s, 1.0f, output_gradient.data(), grad.data(), grad.size());  // + residual
    const tensor middle = grad;
    grad = backward_part(options, saved, attn_drop, branch(middle));
    grad = backward_part(options, saved, attn_proj, grad);
    grad = attention_.backward(s, saved.qkv, saved.probabilities, grad);
    saved.probabilities = tensor();
    grad = backward_part(options, saved, c_attn, grad);
    saved.qkv = tensor();
    grad = backward_part(options, saved, ln_1, grad);
    if (!need_input_gradient) return tensor();
    device.axpy(s, 1.0f, middle.data(), grad.data(), grad.size());  // + residual
    return grad;
  }

  std::vector<parameter*> parameters() override { return parameters_; }

  double forward_flops(int64_t batch) const override {
    double flops = attention_.flops_per_sample() * static_cast<double>(batch);
    for (const auto& each : layers_) flops += each->forward_flops(batch);
    return flops;
  }

 private:
  tensor run_forward(const run_options& options, const tensor& input, block_context* context) {
    const stream s = options.work_stream;
    context->parts.clear();
    context->parts.resize(parts);
    auto run = [&](size_t i, const tensor& x) {
      forward_result result = layers_[i]->forward(options, x);
      context->parts[i] = std::move(result.context);
      return result.output;
    };
    context->qkv = run(c_attn, run(ln_1, input));
    tensor attended;
    attention_.forward(s, context->qkv, &context->probabilities, &attended);
    tensor middle = run(attn_drop, run(attn_proj, attended));
    input.device().axpy(s, 1.0f, input.data(), middle.data(), middle.size());
    tensor output = run(mlp_drop, run(mlp_proj, run(gelu, run(c_fc, run(ln_2, middle)))));
    input.device().axpy(s, 1.0f, middle.data(), output.data(), output.size());
    context->complete = true;
    return output;
  }

  tensor backward_part(const run_options& options, block_context& context, size_t i,
                       const tensor& gradient) {
    tensor result = layers_[i]->backward(options, *context.parts[i], gradient, true);
    context.parts[i].reset();
    return result;
  }

  causal_attention attention_;
  float dropout_;
  std::vector<std::unique_ptr<layer>> layers_;
  std::vector<parameter*> parameters_;
};

}  // namespace

std::unique_ptr<layer> make_transformer_block(backend& device, stream s, const layer_spec& spec,
                                              const shape& input, uint64_t seed,
                                              uint64_t layer_index) {
  return std::make_unique<transformer_block>(device, s, spec, input, seed, layer_index);
}

}  // namespace troupe::layers
