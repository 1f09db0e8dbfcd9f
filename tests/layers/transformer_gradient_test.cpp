// Finite-difference checks of the transformer blocks' gradients (embedding, layernorm,
// transformer_block, lm_head) and of the per-token loss, on the CPU backend.

#include <gtest/gtest.h>

#include <cmath>

#include "layers/layer.h"
#include "layers/loss.h"
#include "tests/support/gradient_checker.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers {
namespace {

constexpr int batch = 2;

/// A transformer block's checker: sums over more terms than a linear layer's, so the absolute
/// tolerance is 3e-3.
class block_checker : public testing::gradient_checker {
 public:
  block_checker(const layer_spec& spec, const shape& sample, std::vector<float> input,
                bool recompute = false)
      : gradient_checker(spec, sample, std::move(input), 3e-3, recompute) {}
};

layer_spec block(const std::string& type) {
  layer_spec spec;
  spec.type = type;
  return spec;
}

TEST(TransformerGradientTest, EmbeddingWeightsAndPositions) {
  layer_spec spec = block("embedding");
  spec.vocab = 7;
  spec.dim = 3;
  spec.positions = 6;  // more positions than tokens: the unused ones get zero gradient
  // Token 2 repeats, so its row gathers two gradients; token 6 is never used.
  block_checker checker(spec, {4}, {2, 0, 2, 5, 1, 3, 4, 2});
  checker.check_parameter_gradients();
  for (parameter* p : checker.subject().parameters()) {
    if (p->name != "position") continue;
    std::vector<float> gradient = p->gradient.to_host(p->gradient.device().default_stream());
    for (size_t i = 4 * 3; i < gradient.size(); ++i) EXPECT_EQ(gradient[i], 0.0f) << i;
  }
}

TEST(TransformerGradientTest, LayerNorm) {
  block_checker checker(block("layernorm"), {3, 6}, testing::random_values(batch * 18, 5));
  checker.check_input_gradient();
  checker.check_parameter_gradients();
}

TEST(TransformerGradientTest, TransformerBlock) {
  layer_spec spec = block("transformer_block");
  spec.heads = 2;
  block_checker checker(spec, {4, 8}, testing::random_values(batch * 32, 5));
  EXPECT_EQ(checker.subject().parameters().size(), 12u);
  checker.check_input_gradient();
  checker.check_parameter_gradients(3);
}

TEST(TransformerGradientTest, TransformerBlockWithDropout) {
  layer_spec spec = block("transformer_block");
  spec.heads = 2;
  spec.dropout = 0.25f;  // the masks depend on the step seed alone: the same in every pass
  block_checker checker(spec, {3, 4}, testing::random_values(batch * 12, 7));
  checker.check_input_gradient();
  checker.check_parameter_gradients(2);
}

TEST(TransformerGradientTest, RecomputeGivesTheSameGradients) {
  layer_spec spec = block("transformer_block");
  spec.heads = 2;
  spec.dropout = 0.1f;
  const std::vector<float> input = testing::random_values(batch * 32, 9);
  block_checker kept(spec, {4, 8}, input);
  block_checker recomputed(spec, {4, 8}, input, true);
  EXPECT_EQ(kept.analytic_input_gradient(), recomputed.analytic_input_gradient());
  auto a = kept.subject().parameters(), b = recomputed.subject().parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    stream s = a[i]->gradient.device().default_stream();
    EXPECT_EQ(a[i]->gradient.to_host(s), b[i]->gradient.to_host(s)) << a[i]->name;
  }
}

TEST(TransformerGradientTest, LmHeadOverTokens) {
  layer_spec spec = block("lm_head");
  spec.vocab = 5;
  spec.bias = false;
  block_checker checker(spec, {3, 4}, testing::random_values(batch * 12, 5));
  EXPECT_EQ(checker.subject().parameters().size(), 1u);
  checker.check_input_gradient();
  checker.check_parameter_gradients();
}

TEST(TransformerGradientTest, PerTokenLossIsTheMeanOverEachSamplesTokens) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  const int tokens = 3, vocab = 5;
  std::vector<float> logits = testing::random_values(batch * tokens * vocab, 11, -2.0f, 2.0f);
  std::vector<int32_t> label_values = {0, 3, 4, 1, 2, 2};
  int_tensor labels(*device, batch * tokens);
  labels.copy_from_host(s, label_values.data());
  const shape dims{batch, tokens, vocab};
  auto loss_of = [&](const std::vector<float>& values) {
    auto t = tensor::from_host(*device, s, dims, values);
    return read_totals(s, softmax_cross_entropy(s, t, labels, 1.0f, false)).loss_sum;
  };
  // Per sample scale 1/B: the objective is the mean over all B·T tokens.
  const float scale = 1.0f / batch;
  auto t = tensor::from_host(*device, s, dims, logits);
  std::vector<float> analytic =
      softmax_cross_entropy(s, t, labels, scale, true).gradient.to_host(s);
  for (size_t i = 0; i < logits.size(); ++i) {
    std::vector<float> plus = logits, minus = logits;
    plus[i] += 1e-2f;
    minus[i] -= 1e-2f;
    const double expected = (loss_of(plus) - loss_of(minus)) / (2e-2 * batch * tokens);
    EXPECT_NEAR(analytic[i], expected, 1e-4 + 1e-2 * std::fabs(expected)) << "logit " << i;
  }
}

}  // namespace
}  // namespace troupe::layers
