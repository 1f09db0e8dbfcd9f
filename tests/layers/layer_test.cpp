// Shape inference, deterministic initialization, gradient accumulation and micro-batch
// equivalence of layers and sequential models.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "layers/loss.h"
#include "layers/model.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers {
namespace {

layer_spec block(const std::string& type, int out = 0, int kernel = 0, int padding = 0) {
  return testing::layer_block(type, out, kernel, padding);
}

std::vector<layer_spec> small_cnn() {
  layer_spec dropout = block("dropout");
  dropout.probability = 0.25f;
  return {block("conv2d", 4, 3, 1), block("relu"), block("maxpool2d"), block("flatten"), dropout,
          block("linear", 6),       block("gelu"), block("linear", 3)};
}

TEST(LayerShapeTest, InfersEveryBlock) {
  std::string error;
  auto shapes = infer_shapes(small_cnn(), {1, 6, 6}, &error);
  ASSERT_TRUE(shapes.has_value()) << error;
  EXPECT_EQ((*shapes)[0], (shape{4, 6, 6}));
  EXPECT_EQ((*shapes)[2], (shape{4, 3, 3}));
  EXPECT_EQ((*shapes)[3], (shape{36}));
  EXPECT_EQ(shapes->back(), (shape{3}));
}

TEST(LayerShapeTest, NamesTheBlockThatDoesNotChain) {
  std::string error;
  EXPECT_FALSE(infer_shapes({block("conv2d", 4, 3), block("linear", 10)}, {1, 6, 6}, &error));
  EXPECT_NE(error.find("model.layers[1] (linear)"), std::string::npos) << error;
  EXPECT_NE(error.find("flatten"), std::string::npos) << error;
  EXPECT_FALSE(infer_shapes({block("flatten"), block("conv2d", 2, 3)}, {1, 6, 6}, &error));
  EXPECT_NE(error.find("model.layers[1] (conv2d)"), std::string::npos) << error;
  EXPECT_FALSE(infer_shapes({block("conv2d", 2, 9)}, {1, 6, 6}, &error));
  EXPECT_NE(error.find("larger than its input"), std::string::npos) << error;
  EXPECT_FALSE(infer_shapes({block("softmax")}, {4}, &error));
  EXPECT_NE(error.find("unknown layer type"), std::string::npos) << error;
}

std::vector<std::vector<float>> weights_of(sequential& model, stream s) {
  std::vector<std::vector<float>> result;
  for (parameter* p : model.parameters()) result.push_back(p->value.to_host(s));
  return result;
}

TEST(SequentialTest, InitializationIsSeededAndPartitionIndependent) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  const auto specs = small_cnn();
  sequential whole(*device, s, specs, {1, 6, 6}, 0, specs.size(), 17);
  sequential again(*device, s, specs, {1, 6, 6}, 0, specs.size(), 17);
  sequential other_seed(*device, s, specs, {1, 6, 6}, 0, specs.size(), 18);
  sequential head(*device, s, specs, {1, 6, 6}, 0, 5, 17);
  sequential tail(*device, s, specs, {1, 6, 6}, 5, specs.size(), 17);
  EXPECT_EQ(weights_of(whole, s), weights_of(again, s));
  EXPECT_NE(weights_of(whole, s), weights_of(other_seed, s));
  auto parts = weights_of(head, s);
  for (auto& w : weights_of(tail, s)) parts.push_back(w);
  EXPECT_EQ(weights_of(whole, s), parts);
  EXPECT_EQ(tail.input_shape(), (shape{36}));
}

/// Gradients of a batch of 8, either whole or as two micro-batches of 4 whose gradients
/// accumulate (scaled by 1/8 each): sync-mode pipelining rests on these being equal.
std::vector<std::vector<float>> batch_gradients(bool split) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  const auto specs = small_cnn();
  sequential model(*device, s, specs, {1, 6, 6}, 0, specs.size(), 3);
  const int total = 8;
  std::vector<float> features = testing::random_values(total * 36, 9);
  std::vector<int32_t> labels = {0, 1, 2, 0, 1, 2, 2, 1};
  const int parts = split ? 2 : 1;
  const int size = total / parts;
  for (int part = 0; part < parts; ++part) {
    std::vector<float> chunk(features.begin() + part * size * 36,
                             features.begin() + (part + 1) * size * 36);
    tensor input = tensor::from_host(*device, s, {size, 1, 6, 6}, chunk);
    int_tensor label_tensor(*device, size);
    label_tensor.copy_from_host(s, labels.data() + part * size);
    run_options options{s, pass_mode::training, 77, static_cast<uint64_t>(part * size)};
    sequential_context context;
    tensor logits = model.forward(options, input, &context);
    loss_output loss = softmax_cross_entropy(s, logits, label_tensor, 1.0f / total, true);
    model.backward(options, context, loss.gradient, false);
  }
  std::vector<std::vector<float>> gradients;
  for (parameter* p : model.parameters()) gradients.push_back(p->gradient.to_host(s));
  return gradients;
}

TEST(SequentialTest, MicroBatchesAccumulateToTheWholeBatchGradient) {
  auto whole = batch_gradients(false);
  auto split = batch_gradients(true);
  ASSERT_EQ(whole.size(), split.size());
  for (size_t p = 0; p < whole.size(); ++p) {
    for (size_t i = 0; i < whole[p].size(); ++i) {
      EXPECT_NEAR(whole[p][i], split[p][i], 1e-5f + 1e-4f * std::fabs(whole[p][i]))
          << "parameter " << p << " element " << i;
    }
  }
}

TEST(SequentialTest, EvaluationIgnoresDropoutAndKeepsNoContext) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  layer_spec dropout = block("dropout");
  dropout.probability = 0.5f;
  sequential model(*device, s, {dropout}, {100}, 0, 1, 1);
  tensor input = testing::random_tensor(*device, {2, 100}, 4);
  run_options evaluation{s, pass_mode::evaluation, 5, 0};
  EXPECT_EQ(model.forward(evaluation, input, nullptr).to_host(s), input.to_host(s));
  run_options training{s, pass_mode::training, 5, 0};
  auto dropped = model.forward(training, input, nullptr).to_host(s);
  const auto zeros = std::count(dropped.begin(), dropped.end(), 0.0f);
  EXPECT_GT(zeros, 60);
  EXPECT_LT(zeros, 140);
}

}  // namespace
}  // namespace troupe::layers
