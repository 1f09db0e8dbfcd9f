// Finite-difference checks of every layer's input and weight gradients, and of the loss.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "layers/layer.h"
#include "layers/loss.h"
#include "tests/support/gradient_checker.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers {
namespace {

using testing::gradient_checker;

constexpr int batch = 3;
constexpr float step_size = 1e-2f;

/// A batch of random samples in [low, 1); distinct: spaced 0.05 apart, so a finite-difference
/// step cannot change a maximum.
std::vector<float> random_input(const shape& sample, float low, bool distinct) {
  std::vector<float> values = testing::random_values(batch * element_count(sample), 5, low, 1.0f);
  if (!distinct) return values;
  std::vector<size_t> rank(values.size());
  for (size_t i = 0; i < rank.size(); ++i) rank[i] = i;
  std::sort(rank.begin(), rank.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
  for (size_t r = 0; r < rank.size(); ++r) values[rank[r]] = -1.0f + 0.05f * r;
  return values;
}

gradient_checker checker_for(const layer_spec& spec, const shape& sample, float low = -1.0f,
                             bool distinct = false) {
  return gradient_checker(spec, sample, random_input(sample, low, distinct));
}

layer_spec spec_of(const std::string& type, int out = 0, int kernel = 0, int stride = 0,
                   int padding = 0) {
  layer_spec spec;
  spec.type = type;
  spec.out = out;
  spec.kernel = kernel;
  spec.stride = stride;
  spec.padding = padding;
  return spec;
}

TEST(GradientCheckTest, Linear) {
  gradient_checker checker = checker_for(spec_of("linear", 5), {7});
  checker.check_input_gradient();
  checker.check_parameter_gradients();
}

TEST(GradientCheckTest, LinearWithoutBias) {
  layer_spec spec = spec_of("linear", 4);
  spec.bias = false;
  gradient_checker checker = checker_for(spec, {6});
  EXPECT_EQ(checker.subject().parameters().size(), 1u);
  checker.check_input_gradient();
  checker.check_parameter_gradients();
}

TEST(GradientCheckTest, LinearCutIntoHeadAndTail) {
  // The two parts of a linear layer of 5 outputs cut at output 2, on samples and on tokens.
  for (const shape& sample : {shape{7}, shape{3, 7}}) {
    layer_spec head = spec_of("linear_head", 5);
    head.split = 2;
    gradient_checker head_checker = checker_for(head, sample);
    head_checker.check_input_gradient();
    head_checker.check_parameter_gradients();
    layer_spec tail = head;
    tail.type = "linear_tail";
    shape tail_sample = sample;
    tail_sample.back() += 2;  // the input, then the head's two outputs
    gradient_checker tail_checker = checker_for(tail, tail_sample);
    tail_checker.check_input_gradient();
    tail_checker.check_parameter_gradients();
  }
}

TEST(GradientCheckTest, ConvolutionCutIntoHeadAndTail) {
  // The two parts of a 3x3 convolution of 5 channels that keeps the image's size, cut at 2.
  layer_spec head = spec_of("conv2d_head", 5, 3, 1, 1);
  head.split = 2;
  gradient_checker head_checker = checker_for(head, {3, 4, 5});
  head_checker.check_input_gradient();
  head_checker.check_parameter_gradients();
  layer_spec tail = head;
  tail.type = "conv2d_tail";
  gradient_checker tail_checker = checker_for(tail, {3 + 2, 4, 5});  // the input, then the head's
  tail_checker.check_input_gradient();
  tail_checker.check_parameter_gradients();
}

TEST(GradientCheckTest, Conv2dPadded) {
  gradient_checker checker = checker_for(spec_of("conv2d", 3, 3, 1, 1), {2, 5, 5});
  checker.check_input_gradient();
  checker.check_parameter_gradients();
}

TEST(GradientCheckTest, Conv2dStridedUnpadded) {
  gradient_checker checker = checker_for(spec_of("conv2d", 2, 3, 2, 0), {2, 7, 6});
  checker.check_input_gradient();
  checker.check_parameter_gradients();
}

TEST(GradientCheckTest, MaxPool) {
  gradient_checker checker = checker_for(spec_of("maxpool2d", 0, 2), {2, 4, 6}, -1.0f, true);
  checker.check_input_gradient();
}

TEST(GradientCheckTest, MaxPoolOverlappingWindows) {
  gradient_checker checker = checker_for(spec_of("maxpool2d", 0, 3, 2), {1, 7, 7}, -1.0f, true);
  checker.check_input_gradient();
}

TEST(GradientCheckTest, Relu) {
  // Inputs kept away from the kink at 0, where the derivative is not defined.
  gradient_checker checker = checker_for(spec_of("relu"), {20}, 0.05f);
  checker.check_input_gradient();
  gradient_checker mixed = checker_for(spec_of("relu"), {20});
  std::vector<float> gradient = mixed.analytic_input_gradient();
  EXPECT_TRUE(std::any_of(gradient.begin(), gradient.end(), [](float g) { return g == 0; }));
}

TEST(GradientCheckTest, Tanh) {
  gradient_checker checker = checker_for(spec_of("tanh"), {20});
  checker.check_input_gradient();
}

TEST(GradientCheckTest, Gelu) {
  gradient_checker checker = checker_for(spec_of("gelu"), {20});
  checker.check_input_gradient();
}

TEST(GradientCheckTest, Flatten) {
  gradient_checker checker = checker_for(spec_of("flatten"), {2, 3, 3});
  checker.check_input_gradient();
}

TEST(GradientCheckTest, Dropout) {
  layer_spec spec = spec_of("dropout");
  spec.probability = 0.3f;
  gradient_checker checker = checker_for(spec, {40});
  checker.check_input_gradient();
}

TEST(GradientCheckTest, SoftmaxCrossEntropy) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  const int rows = 4, classes = 5;
  std::vector<float> logits = testing::random_values(rows * classes, 11, -2.0f, 2.0f);
  std::vector<int32_t> label_values = {0, 3, 4, 1};
  int_tensor labels(*device, rows);
  labels.copy_from_host(s, label_values.data());
  auto loss_of = [&](const std::vector<float>& values) {
    auto t = tensor::from_host(*device, s, {rows, classes}, values);
    return read_totals(s, softmax_cross_entropy(s, t, labels, 1.0f, false)).loss_sum;
  };
  auto t = tensor::from_host(*device, s, {rows, classes}, logits);
  const float scale = 0.25f;
  std::vector<float> analytic =
      softmax_cross_entropy(s, t, labels, scale, true).gradient.to_host(s);
  for (size_t i = 0; i < logits.size(); ++i) {
    std::vector<float> plus = logits, minus = logits;
    plus[i] += step_size;
    minus[i] -= step_size;
    const double expected = scale * (loss_of(plus) - loss_of(minus)) / (2.0 * step_size);
    EXPECT_NEAR(analytic[i], expected, 1e-3 + 1e-2 * std::fabs(expected)) << "logit " << i;
  }
}

}  // namespace
}  // namespace troupe::layers
