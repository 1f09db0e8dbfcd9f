// A backward pass split in two halves (B: the input gradient; W: the weight gradients, which
// zero-bubble schedules run later) computes the very numbers of the whole backward pass.

#include <gtest/gtest.h>

#include "layers/layer.h"
#include "layers/model.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers {
namespace {

struct gradients {
  std::vector<float> input;
  std::vector<std::vector<float>> parameters;
};

layer_spec spec_of(const std::string& type, int out = 0, int kernel = 0, int padding = 0) {
  return testing::layer_block(type, out, kernel, padding);
}

/// Trains two keys through a fresh copy of `specs` and returns the gradients: with `split`
/// by backward_input() for both keys first and backward_weights() after, else by backward().
gradients run(const std::vector<layer_spec>& specs, const shape& sample, bool split) {
  auto device = testing::cpu_backend();
  const stream s = device->default_stream();
  sequential model(*device, s, specs, sample, 0, specs.size(), 7);
  const run_options options{s};
  gradients result;
  sequential_context contexts[2];
  for (int key = 0; key < 2; ++key) {
    shape dims{3};
    dims.insert(dims.end(), sample.begin(), sample.end());
    const tensor output =
        model.forward(options, testing::random_tensor(*device, dims, 10 + key), &contexts[key]);
    const tensor output_gradient = testing::random_tensor(*device, output.dims(), 20 + key);
    const tensor input_gradient =
        split ? model.backward_input(options, contexts[key], output_gradient, true)
              : model.backward(options, contexts[key], output_gradient, true);
    result.input = input_gradient.to_host(s);
  }
  if (split) {
    for (auto& context : contexts) model.backward_weights(options, context);
  }
  for (parameter* p : model.parameters()) result.parameters.push_back(p->gradient.to_host(s));
  return result;
}

void expect_split_equals_whole(const std::vector<layer_spec>& specs, const shape& sample) {
  const gradients whole = run(specs, sample, false);
  const gradients split = run(specs, sample, true);
  EXPECT_EQ(whole.input, split.input);
  ASSERT_FALSE(whole.parameters.empty());
  EXPECT_EQ(whole.parameters, split.parameters);
}

TEST(SplitBackwardTest, LinearLayersGiveTheWholeBackwardsNumbers) {
  expect_split_equals_whole({spec_of("linear", 6), spec_of("relu"), spec_of("linear", 4)}, {5});
}

TEST(SplitBackwardTest, ConvolutionGivesTheWholeBackwardsNumbers) {
  expect_split_equals_whole(
      {spec_of("conv2d", 3, 3, 1), spec_of("relu"), spec_of("flatten"), spec_of("linear", 4)},
      {2, 5, 5});
}

TEST(SplitBackwardTest, WeightGradientsWaitForTheSecondHalf) {
  auto device = testing::cpu_backend();
  const stream s = device->default_stream();
  sequential model(*device, s, {spec_of("linear", 4)}, {5}, 0, 1, 7);
  const run_options options{s};
  sequential_context context;
  const tensor output =
      model.forward(options, testing::random_tensor(*device, {2, 5}, 1), &context);
  model.backward_input(options, context, testing::random_tensor(*device, output.dims(), 2), true);
  for (parameter* p : model.parameters()) EXPECT_FALSE(p->has_gradient);
  model.backward_weights(options, context);
  for (parameter* p : model.parameters()) EXPECT_TRUE(p->has_gradient);
}

}  // namespace
}  // namespace troupe::layers
