// Async mode's corrections of stale gradients (parallelism.staleness_correction): their
// update rules on hand-computed examples, and that each reduces to plain async, and so to the
// sequential oracle, when no key is ever stale.

#include <gtest/gtest.h>

#include <cmath>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/engine/admission.h"
#include "actors/engine/sequential_trainer.h"
#include "actors/engine/stage_settings.h"
#include "layers/backend_registry.h"
#include "layers/optimizer.h"
#include "tests/support/job_helpers.h"
#include "tests/support/local_pipeline.h"

namespace troupe::actors {
namespace {

/// A stage that does no arithmetic: it passes payloads through and records the learning rate
/// of every step.
class recording_device final : public stage_device {
 public:
  bool accepts(const key_message&, std::string*) const override { return true; }
  layers::tensor forward(const key_message& message, bool) override { return message.payload; }
  loss_result loss(const layers::tensor& logits, const std::vector<int32_t>&, float,
                   bool) override {
    loss_result result;
    result.gradient = logits;
    return result;
  }
  layers::tensor backward(const key_message& message, bool) override { return message.payload; }
  double squared_gradient_norm() override { return 0; }
  void step(float learning_rate, float, float momentum) override {
    rates.push_back(learning_rate);
    momenta.push_back(momentum);
  }
  void stash_weights(int64_t) override {}
  void stash_predicted_weights(int64_t version, float distance) override {
    predictions.push_back({version, distance});
  }
  void use_weights(int64_t version) override { uses.push_back(version); }
  void release_weights_before(int64_t) override {}
  size_t held_contexts() const override { return 0; }
  std::vector<layers::parameter*> parameters() override { return {}; }
  stage_state save_state() override { return {}; }
  bool load_state(const stage_state&, bool, std::string*) override { return true; }

  std::vector<float> rates;
  std::vector<float> momenta;  ///< -1: the job's
  std::vector<std::pair<int64_t, float>> predictions;
  std::vector<int64_t> uses;
};

std::unique_ptr<layers::backend> cpu() {
  std::string error;
  return layers::create_backend("cpu", 1, &error);
}

layers::dataset training_set(const job_config& config) {
  std::string error;
  auto data = load_job_data(config, &error);
  EXPECT_TRUE(data.has_value()) << error;
  return data->train;
}

/// Stage 0 of 2 at learning rate 0.1, a step per key, no correction yet.
stage_settings first_of_two_stages() {
  stage_settings settings;
  settings.index = 0;
  settings.count = 2;
  settings.learning_rate = [](int64_t) { return 0.1; };
  return settings;
}

/// The weights (1, -2) with the gradient (0.5, 1), as a step finds them.
layers::parameter two_weights(layers::backend& device) {
  const layers::stream s = device.default_stream();
  layers::parameter weight;
  weight.value = layers::tensor::from_host(device, s, {2}, {1.0f, -2.0f});
  weight.gradient = layers::tensor::from_host(device, s, {2}, {0.5f, 1.0f});
  weight.has_gradient = true;
  return weight;
}

/// The weights of `config`'s pipeline after `steps` steps, one key in flight, on `data`.
testing::weights one_key_pipeline_weights(const job_config& config, const layers::dataset& data,
                                          int64_t steps) {
  auto device = cpu();
  local_pipeline pipeline(config, *device, data.count(), steps, 0);
  pipeline.train(data, steps);
  return pipeline.weights();
}

key_message message_for(key_kind kind, uint64_t key) {
  key_message message;
  message.kind = kind;
  message.key = key;
  return message;
}

TEST(StalenessCorrectionTest, PipemareScalesEachStepByItsDelayAsTheWarmUpFades) {
  // Stage 0 of 2, lr 0.1, K = 4, a step per key. Keys 0, 1 and 2 go forward at version 0 and
  // come back in turn: staleness 0, 1 and 2. The third step (k = 2) applies a gradient two
  // versions old: lr · 2^-(1 − 2/4) = 0.1 / sqrt(2). Keys 3 and 4 go forward at version 3;
  // key 4 comes back one version late at k = 4 = K, where the rescheduling has faded out.
  stage_settings settings = first_of_two_stages();
  settings.pipemare_warmup_steps = 4;
  recording_device device;
  stage_logic stage(settings, device);
  for (uint64_t key : {0, 1, 2}) stage.handle(message_for(key_kind::forward, key));
  for (uint64_t key : {0, 1, 2}) stage.handle(message_for(key_kind::backward, key));
  for (uint64_t key : {3, 4}) stage.handle(message_for(key_kind::forward, key));
  for (uint64_t key : {3, 4}) stage.handle(message_for(key_kind::backward, key));
  ASSERT_EQ(device.rates.size(), 5u);
  EXPECT_FLOAT_EQ(device.rates[0], 0.1f);  // τ = max(1, 0)
  EXPECT_FLOAT_EQ(device.rates[1], 0.1f);  // τ = 1
  EXPECT_FLOAT_EQ(device.rates[2], static_cast<float>(0.1 / std::sqrt(2.0)));
  EXPECT_FLOAT_EQ(device.rates[3], 0.1f);  // key 3: staleness 0
  EXPECT_FLOAT_EQ(device.rates[4], 0.1f);  // k = K: no rescheduling left
  EXPECT_EQ(stage.staleness_histogram(), (std::vector<int64_t>{2, 2, 1}));
}

TEST(StalenessCorrectionTest, PipemareTakesTheMeanDelayOfTheKeysAStepApplies) {
  // Two keys per step (min_update_interval 2), lr 0.2, K = 10. Steps 0 to 4 apply keys of
  // staleness at most 1 (τ = 1, the plain rate); step 5 applies key 8 (forward at version 2)
  // and key 9 (forward at version 4), staleness 3 and 1: τ = 2, lr · 2^-(1 − 5/10).
  stage_settings settings = first_of_two_stages();
  settings.min_update_interval = 2;
  settings.learning_rate = [](int64_t) { return 0.2; };
  settings.pipemare_warmup_steps = 10;
  recording_device device;
  stage_logic stage(settings, device);
  for (uint64_t key : {0, 1, 2, 3}) stage.handle(message_for(key_kind::forward, key));
  for (uint64_t key : {0, 1, 2, 3}) stage.handle(message_for(key_kind::backward, key));
  ASSERT_EQ(stage.version(), 2);
  // Key 8 forward at version 2; keys 9, 10, 11 after two more steps of other keys.
  stage.handle(message_for(key_kind::forward, 8));
  for (uint64_t key : {4, 5, 6, 7}) stage.handle(message_for(key_kind::forward, key));
  for (uint64_t key : {4, 5, 6, 7}) stage.handle(message_for(key_kind::backward, key));
  ASSERT_EQ(stage.version(), 4);
  stage.handle(message_for(key_kind::forward, 9));
  stage.handle(message_for(key_kind::forward, 10));
  stage.handle(message_for(key_kind::forward, 11));
  stage.handle(message_for(key_kind::backward, 10));
  stage.handle(message_for(key_kind::backward, 11));  // k = 4: staleness 0 and 0
  stage.handle(message_for(key_kind::backward, 8));   // staleness 5 - 2 = 3
  stage.handle(message_for(key_kind::backward, 9));   // staleness 5 - 4 = 1
  ASSERT_EQ(device.rates.size(), 6u);
  EXPECT_FLOAT_EQ(device.rates[4], 0.2f);
  EXPECT_FLOAT_EQ(device.rates[5], static_cast<float>(0.2 * std::pow(2.0, -0.5)));
}

TEST(StalenessCorrectionTest, TwoBwStashesWeightsAndBoundsTheDelayToOne) {
  job_config config =
      testing::small_pipeline_job(4, 4, pipeline_mode::async, pipeline_schedule::gpipe, 640);
  config.parallelism.max_active_keys = 8;
  config.parallelism.min_update_interval = 4;
  config.parallelism.staleness_correction = staleness_correction_kind::two_bw;
  const std::vector<std::shared_ptr<pass_turn>> no_turns;
  EXPECT_TRUE(stage_settings_of(config, 1, 10, 10, no_turns).weight_stashing);
  const admission_settings admission = admission_settings::of(config, 10);
  EXPECT_EQ(admission.max_staleness, 1);
  EXPECT_EQ(admission_policy(admission).admission_limit(), 5);  // MUI · 1 + 1
  auto device = cpu();
  const layers::dataset data = training_set(config);
  local_pipeline pipeline(config, *device, data.count(), 20, 5);
  pipeline.train(data, 20);
  for (int s = 0; s < 4; ++s) {
    EXPECT_LE(pipeline.stage(s).staleness_histogram().size(), 2u) << "stage " << s;
    EXPECT_EQ(pipeline.stage(s).weight_staleness_histogram().size(), 1u) << "stashed";
  }
  // Sync mode has no stale gradient to correct and ignores the setting.
  config.parallelism.mode = pipeline_mode::sync;
  EXPECT_FALSE(stage_settings_of(config, 1, 10, 10, no_turns).weight_stashing);
}

TEST(StalenessCorrectionTest, PredictionRunsAKeyOnTheWeightsItsDelayWillBring) {
  // Stage 0 of 2, lr 0.1, a step per key. Keys 0 and 1 go forward at version 0 with no delay
  // measured yet: plain weights. Key 1 comes back a version late, so the stage's delay is 1:
  // keys 2 and 3 go forward at version 2 on w − 1 · lr · b, predicted once, and their
  // backward passes use the same. Key 2 comes back on time: delay 0, and key 4 runs on the
  // plain weights of version 3.
  stage_settings settings = first_of_two_stages();
  settings.predict_weights = true;
  recording_device device;
  stage_logic stage(settings, device);
  for (uint64_t key : {0, 1}) stage.handle(message_for(key_kind::forward, key));
  for (uint64_t key : {0, 1}) stage.handle(message_for(key_kind::backward, key));
  EXPECT_TRUE(device.predictions.empty());
  EXPECT_TRUE(device.uses.empty());
  for (uint64_t key : {2, 3}) stage.handle(message_for(key_kind::forward, key));
  stage.handle(message_for(key_kind::backward, 2));
  stage.handle(message_for(key_kind::forward, 4));
  stage.handle(message_for(key_kind::backward, 3));
  ASSERT_EQ(device.predictions.size(), 1u);
  EXPECT_EQ(device.predictions[0].first, 2);
  EXPECT_FLOAT_EQ(device.predictions[0].second, 0.1f);
  EXPECT_EQ(device.uses, (std::vector<int64_t>{2, 2, 2, 2}));  // F2, F3, B2, B3
}

TEST(StalenessCorrectionTest, PredictedWeightsAreTheWeightsMovedAlongTheMomentumBuffer) {
  // One linear stage, SGD with momentum 0.9: after a step, forward on the weights predicted
  // 0.3 ahead gives what a stage holding w − 0.3 · velocity gives.
  job_config config =
      testing::small_pipeline_job(1, 1, pipeline_mode::async, pipeline_schedule::gpipe, 64);
  config.model.layers = {testing::block("linear", 4)};
  config.training.momentum = 0.9;
  auto device = cpu();
  const stage_range whole{0, 1};
  auto stage = make_layers_stage_device(config, whole, *device);
  auto reference = make_layers_stage_device(config, whole, *device);
  key_message message;
  message.kind = key_kind::forward;
  message.key = 0;
  std::vector<float> input(8 * 12);
  for (size_t i = 0; i < input.size(); ++i) input[i] = 0.01f * static_cast<float>(i % 17) - 0.05f;
  message.payload = layers::tensor::from_host(*device, device->default_stream(), {8, 12}, input);
  message.labels = std::make_shared<const std::vector<int32_t>>(8, 2);
  const layers::tensor logits = stage->forward(message, true);
  const loss_result loss = stage->loss(logits, *message.labels, 1.0f / 8, true);
  key_message backward = message;
  backward.kind = key_kind::backward;
  backward.payload = loss.gradient;
  stage->backward(backward, false);
  stage->step(0.1f);
  stage_state state = stage->save_state();
  ASSERT_EQ(state.optimizer_state.size(), state.parameters.size());
  for (size_t i = 0; i < state.parameters.size(); ++i) {
    std::vector<float>& values = state.parameters[i].values;
    for (size_t j = 0; j < values.size(); ++j) {
      values[j] += -0.3f * state.optimizer_state[i].values[j];
    }
  }
  std::string error;
  ASSERT_TRUE(reference->load_state(state, true, &error)) << error;
  stage->stash_predicted_weights(1, 0.3f);
  stage->use_weights(1);
  const auto predicted = stage->forward(message, false).to_host(device->default_stream());
  const auto expected = reference->forward(message, false).to_host(device->default_stream());
  ASSERT_EQ(predicted.size(), expected.size());
  for (size_t i = 0; i < predicted.size(); ++i) EXPECT_NEAR(predicted[i], expected[i], 1e-6);
  // The prediction is used once: the stage's own weights are back for the next pass.
  const auto plain = stage->forward(message, false).to_host(device->default_stream());
  EXPECT_NE(plain, predicted);
}

TEST(StalenessCorrectionTest, NesterovRaisesEachStepsMomentumByTheDelayOfItsKeys) {
  // Stage 0 of S = 2, momentum 0.9. Keys 0, 1 and 2 go forward at version 0 and come back in
  // turn, staleness 0, 1 and 2: momentum 0.9, 0.9 + 1 · 0.09 / 2 and 0.9 + 2 · 0.09 / 2. Keys
  // 3 to 6 go forward at version 3; key 6 comes back 3 versions late, a delay above S, which
  // the momentum's bound 0.99 caps.
  stage_settings settings = first_of_two_stages();
  settings.nesterov_momentum = 0.9;
  recording_device device;
  stage_logic stage(settings, device);
  for (uint64_t key : {0, 1, 2}) stage.handle(message_for(key_kind::forward, key));
  for (uint64_t key : {0, 1, 2}) stage.handle(message_for(key_kind::backward, key));
  for (uint64_t key : {3, 4, 5, 6}) stage.handle(message_for(key_kind::forward, key));
  for (uint64_t key : {3, 4, 5, 6}) stage.handle(message_for(key_kind::backward, key));
  ASSERT_EQ(device.momenta.size(), 7u);
  EXPECT_FLOAT_EQ(device.momenta[0], 0.9f);
  EXPECT_FLOAT_EQ(device.momenta[1], 0.945f);
  EXPECT_FLOAT_EQ(device.momenta[2], 0.99f);
  EXPECT_FLOAT_EQ(device.momenta[3], 0.9f);
  EXPECT_FLOAT_EQ(device.momenta[6], 0.99f);
  // Without the correction every step takes the job's momentum.
  recording_device plain_device;
  stage_logic plain(first_of_two_stages(), plain_device);
  for (uint64_t key : {0, 1}) plain.handle(message_for(key_kind::forward, key));
  for (uint64_t key : {0, 1}) plain.handle(message_for(key_kind::backward, key));
  EXPECT_EQ(plain_device.momenta, (std::vector<float>{-1.0f, -1.0f}));
}

TEST(StalenessCorrectionTest, NesterovStepsTwiceAsComputedByHand) {
  // SGD with Nesterov's look-ahead (PyTorch's nesterov=True), lr 0.1: v = μ v + g, then
  // w -= lr (g + μ v). Step 1 at μ = 0.9 with g = (0.5, 1): v = g, w = (1, -2) - 0.19 g =
  // (0.905, -2.19). Step 2 at μ_d = 0.945 (a delay of 1 of 2 stages) with g = (-0.2, 0.4),
  // weighed by (1 - 0.945) / (1 - 0.9) = 0.55: c = (-0.11, 0.22), v = 0.945 v + c =
  // (0.3625, 1.165), w = (0.905 - 0.1 · (c + 0.945 v)) = (0.905 - 0.02325625,
  // -2.19 - 0.1320925).
  auto device = cpu();
  const layers::stream s = device->default_stream();
  layers::parameter weight = two_weights(*device);
  layers::optimizer_settings settings;
  settings.momentum = 0.9f;
  settings.nesterov = true;
  layers::optimizer optimizer(s, settings, {&weight});
  optimizer.step(s, 0.1f);
  std::vector<float> after = weight.value.to_host(s);
  EXPECT_NEAR(after[0], 0.905f, 1e-6);
  EXPECT_NEAR(after[1], -2.19f, 1e-6);
  weight.gradient.copy_from_host(s, std::vector<float>{-0.2f, 0.4f}.data());
  weight.has_gradient = true;
  optimizer.step(s, 0.1f, 1.0f, 0.945f);
  after = weight.value.to_host(s);
  EXPECT_NEAR(after[0], 0.88174375f, 1e-6);
  EXPECT_NEAR(after[1], -2.3220925f, 1e-6);
  EXPECT_NEAR(optimizer.state(0)[0].to_host(s)[1], 1.165f, 1e-6) << "the velocity";
}

TEST(StalenessCorrectionTest, NesterovWithAdamStepsAsNadamTwiceAsComputedByHand) {
  // NAdam (PyTorch's NAdam with μ = β1 at every step), lr 0.01, β2 0.999, ε 1e-8: m = β1 m +
  // (1 - β1) g, v = β2 v + (1 - β2) g², Π *= β1, d = sqrt(v / (1 - β2^t)) + ε, then
  // w -= lr (1 - β1) / (1 - Π) g / d and w -= lr β1 / (1 - Π β1) m / d. Step 1 at β1 = 0.9,
  // step 2 at β1 = 0.945 (a delay of 1 of 2 stages): the moving average needs no weighing.
  auto device = cpu();
  const layers::stream s = device->default_stream();
  layers::parameter weight = two_weights(*device);
  layers::optimizer_settings settings;
  settings.kind = layers::optimizer_kind::adam;
  settings.nesterov = true;
  layers::optimizer optimizer(s, settings, {&weight});
  double w[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0}, product = 1;
  const double gradients[2][2] = {{0.5, 1.0}, {-0.2, 0.4}};
  const double betas[2] = {0.9, 0.945};
  for (int step = 1; step <= 2; ++step) {
    const double beta1 = betas[step - 1];
    if (step == 1) {
      optimizer.step(s, 0.01f);
    } else {
      weight.gradient.copy_from_host(s, std::vector<float>{-0.2f, 0.4f}.data());
      weight.has_gradient = true;
      optimizer.step(s, 0.01f, 1.0f, 0.945f);
    }
    product *= beta1;
    for (int i = 0; i < 2; ++i) {
      const double g = gradients[step - 1][i];
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double d = std::sqrt(v[i] / (1 - std::pow(0.999, step))) + 1e-8;
      w[i] -= 0.01 * (1 - beta1) / (1 - product) * g / d;
      w[i] -= 0.01 * beta1 / (1 - product * beta1) * m[i] / d;
    }
  }
  const std::vector<float> after = weight.value.to_host(s);
  EXPECT_NEAR(after[0], w[0], 1e-6);
  EXPECT_NEAR(after[1], w[1], 1e-6);
  EXPECT_NEAR(optimizer.state(0)[0].to_host(s)[0], m[0], 1e-7) << "the first moment";
}

TEST(StalenessCorrectionTest, NesterovWithAdamWAndOneKeyInFlightIsSequentialNadamW) {
  // MAK = 1: the stages' β1 stays the job's, so the delay-corrected method is NAdam(W).
  job_config config =
      testing::small_pipeline_job(4, 1, pipeline_mode::async, pipeline_schedule::gpipe, 640);
  config.parallelism.max_active_keys = 1;
  config.parallelism.staleness_correction = staleness_correction_kind::nesterov;
  config.training.optimizer = layers::optimizer_kind::adamw;
  config.training.lr = 0.002;
  config.training.weight_decay = 0.01;
  const int64_t steps = 30;
  const layers::dataset data = training_set(config);
  const testing::weights actual = one_key_pipeline_weights(config, data, steps);
  job_config oracle = config;
  oracle.parallelism.staleness_correction = staleness_correction_kind::none;
  oracle.training.nesterov = true;
  EXPECT_LE(
      testing::max_relative_difference(actual, testing::sequential_weights(oracle, data, steps)),
      1e-6);
  // And NAdam is not Adam: the same run without the look-ahead ends elsewhere.
  oracle.training.nesterov = false;
  EXPECT_GT(
      testing::max_relative_difference(actual, testing::sequential_weights(oracle, data, steps)),
      1e-3);
}

TEST(StalenessCorrectionTest, EachCorrectionWithOneKeyInFlightIsSequentialSgd) {
  // MAK = 1: no key is ever stale, so every correction steps as plain async does, which is
  // the sequential trainer's SGD (with Nesterov's look-ahead for "nesterov").
  for (staleness_correction_kind correction :
       {staleness_correction_kind::none, staleness_correction_kind::pipemare,
        staleness_correction_kind::two_bw, staleness_correction_kind::predict,
        staleness_correction_kind::nesterov}) {
    job_config config =
        testing::small_pipeline_job(4, 1, pipeline_mode::async, pipeline_schedule::gpipe, 640);
    config.parallelism.max_active_keys = 1;
    config.parallelism.staleness_correction = correction;
    config.parallelism.correction_warmup_steps = 100;
    config.training.momentum = 0.9;
    const int64_t steps = 30;
    const layers::dataset data = training_set(config);
    const testing::weights actual = one_key_pipeline_weights(config, data, steps);
    job_config oracle = config;
    oracle.training.nesterov = correction == staleness_correction_kind::nesterov;
    const testing::weights expected = testing::sequential_weights(oracle, data, steps);
    EXPECT_LE(testing::max_relative_difference(actual, expected), 1e-6) << to_string(correction);
  }
}

}  // namespace
}  // namespace troupe::actors
