#include <cmath>

#include "layers/check.h"
#include "layers/layer_kinds.h"
#include "layers/random.h"

namespace troupe::layers {
namespace {

/// Where one batch of equally long sequences lies in an attention call's tokens: `count`
/// sequences of `length` tokens from token `first_token`, their attention probabilities from
/// float `first_probability` (count × heads × length² of them).
struct sequence_run {
  int count = 0;
  int length = 0;
  int64_t first_token = 0;
  int64_t first_probability = 0;
};

/// Causal multi-head self-attention over a [B, T, 3D] tensor of queries, keys and values (the
/// output of attn.c_attn, heads side by side in each third, as nanoGPT lays them out). Every
/// product is a set of batched GEMMs read in place through row strides (no copies into per-head
/// layouts): one call per head batched over the sequences, or one per sequence batched over
/// the heads, whichever makes fewer calls. The B·T tokens are B sequences of T, or the packed
/// sequences of run_options::segments (a model graph's instances), each attended within itself.
class causal_attention {
 public:
  causal_attention(int length, int width, int heads)
      : t_(length),
        d_(width),
        h_(heads),
        hd_(width / heads),
        scale_(1.0f / std::sqrt(static_cast<float>(width / heads))) {}

  /// The sequences of `qkv`'s tokens: B of T, or one run per segment.
  std::vector<sequence_run> runs_of(const tensor& qkv, const std::vector<int64_t>* segments) const {
    const int64_t tokens = qkv.size() / (3 * int64_t(d_));
    if (segments == nullptr) return {{static_cast<int>(tokens / t_), t_, 0, 0}};
    TROUPE_CHECK(!segments->empty() && segments->front() == 0 && segments->back() == tokens);
    std::vector<sequence_run> runs;
    int64_t probabilities = 0;
    for (size_t i = 0; i + 1 < segments->size(); ++i) {
      const int64_t length = (*segments)[i + 1] - (*segments)[i];
      TROUPE_CHECK(length >= 0);
      if (length == 0) continue;
      runs.push_back({1, static_cast<int>(length), (*segments)[i], probabilities});
      probabilities += h_ * length * length;
    }
    return runs;
  }

  /// y [B, T, D]; `probabilities` ([B, H, T, T], or the runs' one after the other) is kept for
  /// the backward pass.
  void forward(stream s, const tensor& qkv, const std::vector<sequence_run>& runs,
               tensor* probabilities, tensor* y) const {
    backend& device = qkv.device();
    *probabilities = tensor(device, probability_dims(qkv, runs));
    shape dims = qkv.dims();
    dims.back() = d_;
    *y = tensor(device, dims);
    for (const sequence_run& run : runs) {
      const geometry g = geometry_of(run);
      const float* q = qkv.data() + run.first_token * 3 * d_;
      float* p = probabilities->data() + run.first_probability;
      const float* p_in = p;
      // S = Q K^T, then P = causal softmax(S scale), then Y = P V.
      products(s, device, g, transpose::no, transpose::yes, g.t, g.t, hd_, g.qkv(q), g.qkv(q + d_),
               g.scores(p));
      device.causal_softmax_forward(s, p, p, run.count * h_, g.t, scale_);
      products(s, device, g, transpose::no, transpose::no, g.t, hd_, g.t, g.scores(p_in),
               g.qkv(q + 2 * d_), g.heads(y->data() + run.first_token * d_));
    }
  }

  /// The gradient of the [B, T, 3D] input from that of y.
  tensor backward(stream s, const tensor& qkv, const std::vector<sequence_run>& runs,
                  const tensor& probabilities, const tensor& dy) const {
    backend& device = qkv.device();
    tensor dqkv(device, qkv.dims());
    tensor dp(device, probabilities.dims());
    for (const sequence_run& run : runs) {
      const geometry g = geometry_of(run);
      const float* q = qkv.data() + run.first_token * 3 * d_;
      float* dq = dqkv.data() + run.first_token * 3 * d_;
      const float* p = probabilities.data() + run.first_probability;
      float* ds = dp.data() + run.first_probability;
      const float* ds_in = ds;
      const operand grad = g.heads(static_cast<const float*>(dy.data() + run.first_token * d_));
      // dP = dY V^T and dV = P^T dY, head by head.
      products(s, device, g, transpose::no, transpose::yes, g.t, g.t, hd_, grad, g.qkv(q + 2 * d_),
               g.scores(ds));
      products(s, device, g, transpose::yes, transpose::no, g.t, hd_, g.t, g.scores(p), grad,
               g.qkv(dq + 2 * d_));
      device.softmax_backward(s, p, ds, ds, run.count * h_ * g.t, g.t, scale_);
      // dQ = dS K and dK = dS^T Q.
      products(s, device, g, transpose::no, transpose::no, g.t, hd_, g.t, g.scores(ds_in),
               g.qkv(q + d_), g.qkv(dq));
      products(s, device, g, transpose::yes, transpose::no, g.t, hd_, g.t, g.scores(ds_in),
               g.qkv(q), g.qkv(dq + d_));
    }
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

  /// The operands' layouts for one run of sequences of t tokens.
  struct geometry {
    int count, t, d, hd, h;

    /// Queries, keys or values (a third of each qkv row), or their gradients.
    template <typename value>
    strided<value> qkv(value* first) const {
      return {first, int64_t(t) * 3 * d, hd, 3 * d};
    }
    /// A [T, T] matrix per sequence and head: scores, probabilities or their gradients.
    template <typename value>
    strided<value> scores(value* first) const {
      return {first, int64_t(h) * t * t, int64_t(t) * t, t};
    }
    /// A head's columns of [T, D] rows (y and its gradient).
    template <typename value>
    strided<value> heads(value* first) const {
      return {first, int64_t(t) * d, hd, d};
    }
  };

  geometry geometry_of(const sequence_run& run) const {
    return {run.count, run.length, d_, hd_, h_};
  }

  /// [B, H, T, T] for B sequences of T; a flat run of every run's probabilities otherwise.
  shape probability_dims(const tensor& qkv, const std::vector<sequence_run>& runs) const {
    if (runs.size() == 1 && runs[0].first_token == 0 && runs[0].length == t_ &&
        int64_t(runs[0].count) * t_ * 3 * d_ == qkv.size()) {
      return {runs[0].count, h_, t_, t_};
    }
    int64_t total = 0;
    for (const sequence_run& run : runs) total += int64_t(run.count) * h_ * run.length * run.length;
    return {total};
  }

  /// C(b, h) = op(A(b, h)) op(B(b, h)) for every sequence b and head h of a run, in the fewer
  /// calls.
  void products(stream s, backend& device, const geometry& g, transpose transpose_a,
                transpose transpose_b, int m, int n, int k, const operand& a, const operand& b,
                const output& c) const {
    const bool by_head = g.count >= h_;  // one call per head, batched over the sequences
    const int calls = by_head ? h_ : g.count, batched = by_head ? g.count : h_;
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
  /// The forward pass's run_options::segments, which the backward pass attends within again.
  std::shared_ptr<const std::vector<int64_t>> segments;
  bool complete = false;  ///< false under recompute until the backward pass rebuilds it
};

/// A GPT-2 block: x + attn(ln_1(x)), then + mlp(ln_2(.)), with a GELU MLP of mlp_ratio times
/// the width and dropout on both residual branches. Built from the library's own layers, whose
/// parameters take nanoGPT's names (ln_1.weight, attn.c_attn.weight, mlp.c_fc.weight, ...), so
/// the block's tensors load into a PyTorch module by name. Its linear layers run on every token
/// of the input at once; only attention follows the sequences (run_options::segments).
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
    context->segments = options.segments;
    tensor output = run_forward(options, input, context.get());
    if (options.mode != pass_mode::training) return {output, std::make_unique<block_context>()};
    if (options.recompute) {
      // Keep the input alone; the backward pass runs the forward again (the dropout masks
      // are counter-based, so it draws the same ones).
      context = std::make_unique<block_context>();
      context->input = input;
      context->segments = options.segments;
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
    grad = attention_.backward(s, saved.qkv, attention_.runs_of(saved.qkv, saved.segments.get()),
                               saved.probabilities, grad);
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
    attention_.forward(s, context->qkv, attention_.runs_of(context->qkv, context->segments.get()),
                       &context->probabilities, &attended);
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
