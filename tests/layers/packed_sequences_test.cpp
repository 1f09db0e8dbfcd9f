// Blocks over packed sequences (run_options::segments, a model graph's instances without
// padding): finite-difference gradients of a transformer block over sequences of different
// lengths in one call, and the packed call against each sequence run alone as a sample of its
// own length (outputs, input gradients and every weight gradient).

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "layers/layer.h"
#include "tests/support/gradient_checker.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers {
namespace {

constexpr int width = 8;

layer_spec block() {
  layer_spec spec;
  spec.type = "transformer_block";
  spec.heads = 2;
  return spec;
}

layer_spec embedding() {
  layer_spec spec;
  spec.type = "embedding";
  spec.vocab = 7;
  spec.dim = width;
  spec.positions = 6;
  return spec;
}

/// What one forward and backward pass gave.
struct pass {
  std::vector<float> output;
  std::vector<float> input_gradient;
  std::vector<std::vector<float>> gradients;
};

/// Builds `spec` on samples of `sample` and runs it forward and backward on `input` (whole
/// samples) with `upstream` as the output's gradient, on the packed `segments` when given.
pass run(const layer_spec& spec, const shape& sample, const std::vector<float>& input,
         const std::vector<float>& upstream, std::vector<int64_t> segments = {},
         bool recompute = false) {
  auto device = testing::cpu_backend();
  const stream s = device->default_stream();
  auto subject = make_layer(*device, s, spec, sample, 99, 4);
  shape dims{static_cast<int64_t>(input.size()) / element_count(sample)};
  dims.insert(dims.end(), sample.begin(), sample.end());
  run_options options{s, pass_mode::training, 1234, 0, recompute};
  if (!segments.empty())
    options.segments = std::make_shared<const std::vector<int64_t>>(std::move(segments));
  forward_result result = subject->forward(options, tensor::from_host(*device, s, dims, input));
  pass out;
  out.output = result.output.to_host(s);
  const tensor gradient = tensor::from_host(*device, s, result.output.dims(), upstream);
  // The backward pass follows the segments its forward pass saw, whatever its own options say.
  options.segments = nullptr;
  out.input_gradient = subject->backward(options, *result.context, gradient, true).to_host(s);
  for (parameter* p : subject->parameters()) out.gradients.push_back(p->gradient.to_host(s));
  return out;
}

void expect_near(const std::vector<float>& actual, const std::vector<float>& expected,
                 const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i)
    EXPECT_NEAR(actual[i], expected[i], 1e-5 * (1.0 + std::fabs(expected[i])))
        << what << " element " << i;
}

/// Sequences of 3 and 4 tokens packed as 7 rows of one token each, as a model graph's node
/// runs them, against each sequence alone as one sample of its length; gradients add up.
void expect_packed_equals_alone(const layer_spec& spec, const shape& token,
                                const std::vector<float>& input) {
  const int64_t per_token = element_count(token);
  const int64_t lengths[] = {3, 4};
  const std::vector<float> upstream = testing::random_values(7 * width, 17);
  const pass packed = run(spec, token, input, upstream, {0, 3, 7});
  pass alone;
  int64_t first = 0;
  for (int64_t length : lengths) {
    shape sample = token;
    sample[0] = length;  // one sample of `length` tokens
    const auto piece = [&](const std::vector<float>& values, int64_t per) {
      return std::vector<float>(values.begin() + first * per,
                                values.begin() + (first + length) * per);
    };
    const pass one = run(spec, sample, piece(input, per_token), piece(upstream, width), {});
    alone.output.insert(alone.output.end(), one.output.begin(), one.output.end());
    alone.input_gradient.insert(alone.input_gradient.end(), one.input_gradient.begin(),
                                one.input_gradient.end());
    if (alone.gradients.empty()) alone.gradients.assign(one.gradients.size(), {});
    for (size_t p = 0; p < one.gradients.size(); ++p) {
      alone.gradients[p].resize(one.gradients[p].size(), 0.0f);
      for (size_t i = 0; i < one.gradients[p].size(); ++i)
        alone.gradients[p][i] += one.gradients[p][i];
    }
    first += length;
  }
  expect_near(packed.output, alone.output, "output");
  expect_near(packed.input_gradient, alone.input_gradient, "input gradient");
  ASSERT_EQ(packed.gradients.size(), alone.gradients.size());
  for (size_t p = 0; p < packed.gradients.size(); ++p)
    expect_near(packed.gradients[p], alone.gradients[p], "parameter " + std::to_string(p));
}

TEST(PackedSequencesTest, TransformerBlockGradientsMatchFiniteDifferences) {
  // Sequences of 3 and 4 tokens, each token a row as a model graph's node holds them.
  testing::gradient_checker checker(block(), {1, width}, testing::random_values(7 * width, 5),
                                    3e-3);
  checker.set_segments({0, 3, 7});
  checker.check_input_gradient();
  checker.check_parameter_gradients(3);
}

TEST(PackedSequencesTest, TransformerBlockEqualsEachSequenceAlone) {
  expect_packed_equals_alone(block(), {1, width}, testing::random_values(7 * width, 5));
}

TEST(PackedSequencesTest, RecomputeAttendsWithinTheSameSequences) {
  // The backward pass of a recomputed block runs its forward again on the forward's segments.
  layer_spec spec = block();
  spec.dropout = 0.1f;
  const std::vector<float> input = testing::random_values(7 * width, 5);
  const std::vector<float> upstream = testing::random_values(7 * width, 17);
  const pass kept = run(spec, {1, width}, input, upstream, {0, 3, 7});
  const pass recomputed = run(spec, {1, width}, input, upstream, {0, 3, 7}, true);
  EXPECT_EQ(kept.output, recomputed.output);
  EXPECT_EQ(kept.input_gradient, recomputed.input_gradient);
  EXPECT_EQ(kept.gradients, recomputed.gradients);
}

TEST(PackedSequencesTest, AttentionStaysWithinEachSequence) {
  // A change in the second sequence, which follows the first in the rows, leaves the first's
  // outputs exactly as they were.
  std::vector<float> input = testing::random_values(7 * width, 5);
  const std::vector<float> upstream(7 * width, 1.0f);
  const pass before = run(block(), {1, width}, input, upstream, {0, 3, 7});
  for (size_t i = 3 * width; i < input.size(); ++i) input[i] += 0.5f;
  const pass after = run(block(), {1, width}, input, upstream, {0, 3, 7});
  for (size_t i = 0; i < 3 * width; ++i) EXPECT_EQ(before.output[i], after.output[i]) << i;
  bool changed = false;
  for (size_t i = 3 * width; i < input.size(); ++i) changed |= before.output[i] != after.output[i];
  EXPECT_TRUE(changed);
}

TEST(PackedSequencesTest, EmbeddingPositionsCountFromZeroInEachSequence) {
  expect_packed_equals_alone(embedding(), {1}, {2, 0, 2, 5, 1, 3, 4});
}

TEST(PackedSequencesTest, AnEmbeddingWithoutExplicitPositionsSharesItsOne) {
  // positions = 0 on one-token samples: one learned vector added to every row, segments or not.
  layer_spec spec = embedding();
  spec.positions = 0;
  const std::vector<float> ids = {2, 0, 2, 5, 1, 3, 4};
  const std::vector<float> upstream = testing::random_values(7 * width, 17);
  const pass packed = run(spec, {1}, ids, upstream, {0, 3, 7});
  const pass rows = run(spec, {1}, ids, upstream, {});
  EXPECT_EQ(packed.output, rows.output);
  EXPECT_EQ(packed.gradients, rows.gradients);
}

}  // namespace
}  // namespace troupe::layers
