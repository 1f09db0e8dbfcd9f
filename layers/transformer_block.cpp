#include <cmath>

#include "layers/layer_kinds.h"
#include "layers/random.h"

namespace troupe::layers {
namespace {

/// Causal multi-head self-attention over a [B, T, 3D] tensor of queries, keys and values (the
/// output of attn.c_attn, heads side by side in each third, as nanoGPT lays them out). Every
/// product is a set of batched GEMMs read in place through row strides (no copies into per-head
/// layouts): one call per head batched over the sequences, or one per sequence batched over
/// the heads, whichever makes fewer calls.
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
    const float* q = qkv.data();
    // S = Q K^T, then P = causal softmax(S scale), then Y = P V.
    products(s, device, batch, transpose::no, transpose::yes, t_, t_, hd_,
             {q, sample_, hd_, 3 * d_}, {q + d_, sample_, hd_, 3 * d_},
             {probabilities->data(), h_ * square(), square(), t_});
    device.causal_softmax_forward(s, probabilities->data(), probabilities->data(), batch * h_, t_,
                                  scale_);
    products(s, device, batch, transpose::no, transpose::no, t_, hd_, t_,
             {probabilities->data(), h_ * square(), square(), t_},
             {q + 2 * d_, sample_, hd_, 3 * d_}, {y->data(), int64_t(t_) * d_, hd_, d_});
  }

  /// The gradient of the [B, T, 3D] input from that of y.
  tensor backward(stream s, const tensor& qkv, const tensor& probabilities,
                  const tensor& dy) const {
    backend& device = qkv.device();
    const int batch = static_cast<int>(qkv.rows());
    tensor dqkv(device, qkv.dims());
    tensor dp(device, probabilities.dims());
    const float* q = qkv.data();
    const operand grad{dy.data(), int64_t(t_) * d_, hd_, d_};
    const operand p{probabilities.data(), h_ * square(), square(), t_};
    const operand ds{dp.data(), h_ * square(), square(), t_};
    // dP = dY V^T and dV = P^T dY, head by head.
    products(s, device, batch, transpose::no, transpose::yes, t_, t_, hd_, grad,
             {q + 2 * d_, sample_, hd_, 3 * d_}, {dp.data(), h_ * square(), square(), t_});
    products(s, device, batch, transpose::yes, transpose::no, t_, hd_, t_, p, grad,
             {dqkv.data() + 2 * d_, sample_, hd_, 3 * d_});
    device.softmax_backward(s, probabilities.data(), dp.data(), dp.data(), batch * h_ * t_, t_,
                            scale_);
    // dQ = dS K and dK = dS^T Q.
    products(s, device, batch, transpose::no, transpose::no, t_, hd_, t_, ds,
             {q + d_, sample_, hd_, 3 * d_}, {dqkv.data(), sample_, hd_, 3 * d_});
    products(s, device, batch, transpose::yes, transpose::no, t_, hd_, t_, ds,
             {q, sample_, hd_, 3 * d_}, {dqkv.data() + d_, sample_, hd_, 3 * d_});
    return dqkv;
  }

  /// Multiply-adds of both products, doubled: FLOPs of one sample's forward pass.
  double flops_per_sample() const { return 4.0 * t_ * t_ * d_; }

 private:
  /// One operand of the per-(sequence, head) products: where sequence 0's head 0 starts, the
  /// distance to the next sequence and to the next head, and its row stride.
  template <typename value>
  struct strided {
    value* first;
    int64_t per_sequence, per_head;
    int rows_apart;
  };

  using operand = strided<const float>;
  using output = strided<float>;

  int64_t square() const { return int64_t(t_) * t_; }

  /// C(b, h) = op(A(b, h)) op(B(b, h)) for every sequence b and head h, in the fewer calls.
  void products(stream s, backend& device, int batch, transpose transpose_a, transpose transpose_b,
                int m, int n, int k, const operand& a, const operand& b, const output& c) const {
    const bool by_head = batch >= h_;  // one call per head, batched over the sequences
    const int calls = by_head ? h_ : batch, batched = by_head ? batch : h_;
    auto start = [&](const auto& x, int call) {
      return call * (by_head ? x.per_head : x.per_sequence);
    };
    auto stride = [&](const auto& x) { return by_head ? x.per_sequence : x.per_head; };
    for (int call = 0; call < calls; ++call) {
      device.gemm_batched(s, transpose_a, transpose_b, m, n, k, 1.0f, a.first + start(a, call),
                          a.rows_apart, stride(a), b.first + start(b, call), b.rows_apart,
                          stride(b), 0.0f, c.first + start(c, call), c.rows_apart, stride(c),
                          batched);
    }
  }

  int t_, d_, h_, hd_;
  int64_t sample_ = int64_t(t_) * 3 * d_;  // one sequence of qkv
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
