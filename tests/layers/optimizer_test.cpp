#include <gtest/gtest.h>

#include <cmath>

#include "layers/optimizer.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers {
namespace {

parameter make_parameter(backend& device, std::vector<float> weights, std::vector<float> grads) {
  stream s = device.default_stream();
  parameter p;
  p.name = "weight";
  const int64_t n = static_cast<int64_t>(weights.size());
  p.value = tensor::from_host(device, s, {n}, weights);
  p.gradient = tensor::from_host(device, s, {n}, grads);
  p.has_gradient = true;
  return p;
}

TEST(OptimizerTest, SgdWithMomentumAndWeightDecayFollowsPyTorch) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  parameter p = make_parameter(*device, {1.0f, -2.0f}, {0.5f, 0.25f});
  optimizer_settings settings;
  settings.momentum = 0.9f;
  settings.weight_decay = 0.1f;
  optimizer sgd(s, settings, {&p});
  double w[2] = {1.0, -2.0}, v[2] = {0, 0};
  const double g[2] = {0.5, 0.25};
  for (int step = 0; step < 3; ++step) {
    p.gradient = tensor::from_host(*device, s, {2}, {0.5f, 0.25f});
    p.has_gradient = true;
    sgd.step(s, 0.1f);
    EXPECT_FALSE(p.has_gradient);
    for (int i = 0; i < 2; ++i) {
      v[i] = 0.9 * v[i] + g[i] + 0.1 * w[i];
      w[i] -= 0.1 * v[i];
    }
  }
  auto result = p.value.to_host(s);
  EXPECT_NEAR(result[0], w[0], 1e-6);
  EXPECT_NEAR(result[1], w[1], 1e-6);
}

TEST(OptimizerTest, AdamFollowsPyTorch) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  parameter p = make_parameter(*device, {0.5f}, {0.2f});
  optimizer_settings settings;
  settings.kind = optimizer_kind::adam;
  optimizer adam(s, settings, {&p});
  double w = 0.5, m = 0, v = 0;
  for (int step = 1; step <= 3; ++step) {
    const double g = 0.2 * step;
    p.gradient = tensor::from_host(*device, s, {1}, {static_cast<float>(g)});
    p.has_gradient = true;
    adam.step(s, 0.01f);
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    const double m_hat = m / (1 - std::pow(0.9, step));
    const double v_hat = v / (1 - std::pow(0.999, step));
    w -= 0.01 * m_hat / (std::sqrt(v_hat) + 1e-8);
  }
  EXPECT_NEAR(p.value.to_host(s)[0], w, 1e-6);
}

TEST(OptimizerTest, NadamFollowsPyTorch) {
  // torch.optim.NAdam(momentum_decay=1e4), whose momentum schedule is then β1 at every step,
  // with L2 weight decay 0.1 added to the gradient: the look-ahead's bias correction is
  // 1 - Π β1 (Dozat's, and PyTorch's from 2.0; 1.13 multiplied one more β1 into it).
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  parameter p = make_parameter(*device, {0.5f}, {0.2f});
  optimizer_settings settings;
  settings.kind = optimizer_kind::adam;
  settings.nesterov = true;
  settings.weight_decay = 0.1f;
  optimizer nadam(s, settings, {&p});
  double w = 0.5, m = 0, v = 0, mu_product = 1;
  for (int step = 1; step <= 3; ++step) {
    const double g = 0.2 * step + 0.1 * w;
    p.gradient = tensor::from_host(*device, s, {1}, {static_cast<float>(0.2 * step)});
    p.has_gradient = true;
    nadam.step(s, 0.01f);
    mu_product *= 0.9;
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    const double denominator = std::sqrt(v / (1 - std::pow(0.999, step))) + 1e-8;
    w -= 0.01 * (1 - 0.9) / (1 - mu_product) * g / denominator;
    w -= 0.01 * 0.9 / (1 - mu_product * 0.9) * m / denominator;
  }
  EXPECT_NEAR(p.value.to_host(s)[0], w, 1e-6);
  // A checkpoint restores the step count and the moments; the product of β1 follows, so a
  // resumed optimizer's next step is the uninterrupted one's.
  parameter resumed_weight = make_parameter(*device, p.value.to_host(s), {0.8f});
  optimizer resumed(s, settings, {&resumed_weight});
  resumed.set_steps_taken(nadam.steps_taken());
  for (size_t k = 0; k < 2; ++k) {
    resumed.state(0)[k].copy_from_host(s, nadam.state(0)[k].to_host(s).data());
  }
  p.gradient = tensor::from_host(*device, s, {1}, {0.8f});
  p.has_gradient = true;
  nadam.step(s, 0.01f);
  resumed.step(s, 0.01f);
  EXPECT_EQ(resumed_weight.value.to_host(s)[0], p.value.to_host(s)[0]);
}

TEST(OptimizerTest, SkipsParametersWithoutGradient) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  parameter p = make_parameter(*device, {1.0f}, {5.0f});
  p.has_gradient = false;
  optimizer sgd(s, optimizer_settings{}, {&p});
  sgd.step(s, 1.0f);
  EXPECT_EQ(p.value.to_host(s)[0], 1.0f);
  EXPECT_EQ(sgd.steps_taken(), 1);
}

TEST(OptimizerTest, GradientScaleMultipliesGradients) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  parameter p = make_parameter(*device, {1.0f}, {4.0f});
  optimizer sgd(s, optimizer_settings{}, {&p});
  sgd.step(s, 0.5f, 0.25f);
  EXPECT_FLOAT_EQ(p.value.to_host(s)[0], 0.5f);
}

}  // namespace
}  // namespace troupe::layers
