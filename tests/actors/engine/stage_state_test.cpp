// Stage state: shard bytes round trip, hostile shard bytes are refused, and a stage that loads
// another's saved state continues exactly as the original would.

#include "actors/engine/stage_state.h"

#include <gtest/gtest.h>

#include "actors/engine/partition.h"
#include "actors/engine/stage_device.h"
#include "actors/engine/stage_logic.h"
#include "layers/backend_registry.h"
#include "tests/support/job_helpers.h"

namespace troupe::actors {
namespace {

stage_state sample_state() {
  stage_state state;
  state.stage = 1;
  state.stages = 3;
  state.first_block = 2;
  state.last_block = 5;
  state.weight_version = 17;
  state.keys_since_step = 2;
  state.optimizer_steps = 17;
  state.seed = 99;
  state.parameters = {{"linear2.weight", {2, 3}, {1, 2, 3, 4, 5, 6}},
                      {"linear2.bias", {2}, {7, 8}}};
  state.gradients = {{"linear2.bias", {2}, {0.5f, -0.5f}}};
  state.optimizer_state = {{"linear2.weight.velocity", {2, 3}, {0, 0, 0, 1, 1, 1}}};
  return state;
}

void expect_equal(const std::vector<named_tensor>& left, const std::vector<named_tensor>& right) {
  ASSERT_EQ(left.size(), right.size());
  for (size_t i = 0; i < left.size(); ++i) {
    EXPECT_EQ(left[i].name, right[i].name);
    EXPECT_EQ(left[i].dims, right[i].dims);
    EXPECT_EQ(left[i].values, right[i].values);
  }
}

TEST(StageStateTest, ShardBytesRoundTrip) {
  const stage_state state = sample_state();
  const std::string bytes = serialize_stage_state(state);
  std::string error;
  auto back = parse_stage_state(bytes.data(), bytes.size(), &error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(back->stage, 1);
  EXPECT_EQ(back->stages, 3);
  EXPECT_EQ(back->first_block, 2);
  EXPECT_EQ(back->last_block, 5);
  EXPECT_EQ(back->weight_version, 17);
  EXPECT_EQ(back->keys_since_step, 2);
  EXPECT_EQ(back->optimizer_steps, 17);
  EXPECT_EQ(back->seed, 99u);
  expect_equal(back->parameters, state.parameters);
  expect_equal(back->gradients, state.gradients);
  expect_equal(back->optimizer_state, state.optimizer_state);
  EXPECT_EQ(stage_state_values(state), 6 + 2 + 2 + 6);
}

TEST(StageStateTest, EveryTruncationAndBadMagicIsRefused) {
  const std::string bytes = serialize_stage_state(sample_state());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    std::string error;
    EXPECT_FALSE(parse_stage_state(bytes.data(), cut, &error)) << "cut at " << cut;
    EXPECT_FALSE(error.empty());
  }
  std::string longer = bytes + "x";
  std::string error;
  EXPECT_FALSE(parse_stage_state(longer.data(), longer.size(), &error));
  EXPECT_NE(error.find("stray"), std::string::npos) << error;
  std::string wrong = bytes;
  wrong[0] = 'X';
  EXPECT_FALSE(parse_stage_state(wrong.data(), wrong.size(), &error));
  EXPECT_NE(error.find("magic"), std::string::npos) << error;
}

TEST(StageStateTest, HugeCountsAreRefusedBeforeAllocating) {
  std::string bytes = serialize_stage_state(sample_state());
  // Every 8-byte window overwritten with 0xff..: a count or dimension that cannot fit.
  for (size_t at = 12; at + 8 <= bytes.size(); at += 8) {
    std::string bad = bytes;
    for (size_t i = 0; i < 8; ++i) bad[at + i] = static_cast<char>(0xff);
    std::string error;
    auto state = parse_stage_state(bad.data(), bad.size(), &error);
    if (state) {
      EXPECT_LE(stage_state_values(*state), 64);
    }
  }
}

TEST(StageStateTest, LoadedStageContinuesExactlyAsTheOriginal) {
  job_config config =
      testing::small_pipeline_job(2, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64);
  config.training.optimizer = layers::optimizer_kind::adam;
  std::string error;
  auto ranges = partition_model(config, &error);
  ASSERT_TRUE(ranges) << error;
  auto backend = layers::create_backend("cpu", 1, &error);
  ASSERT_TRUE(backend) << error;
  auto make = [&](std::unique_ptr<stage_device>* device) {
    *device = make_layers_stage_device(config, (*ranges)[1], *backend);
    stage_settings settings;
    settings.index = 1;
    settings.count = 2;
    settings.min_update_interval = 2;
    return std::make_unique<stage_logic>(settings, **device);
  };
  std::unique_ptr<stage_device> first_device, second_device;
  auto first = make(&first_device);
  auto second = make(&second_device);
  const layers::shape input =
      first_device->save_state().parameters.empty()
          ? layers::shape{}
          : layers::shape{4, first_device->save_state().parameters[0].dims[1]};
  auto run_key = [&](stage_logic& logic, uint64_t key) {
    key_message message;
    message.key = key;
    message.step = static_cast<int64_t>(key / 2);
    std::vector<float> values(layers::element_count(input));
    for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.1f * (i + key));
    message.payload = layers::tensor::from_host(*backend, backend->default_stream(), input, values);
    message.labels = std::make_shared<std::vector<int32_t>>(std::vector<int32_t>{0, 1, 2, 3});
    ASSERT_FALSE(logic.handle(message).empty());
  };
  for (uint64_t key = 0; key < 5; ++key) run_key(*first, key);  // one key accumulated
  stage_state saved = first->save_state();
  EXPECT_EQ(saved.weight_version, 2);
  EXPECT_EQ(saved.keys_since_step, 1);
  EXPECT_FALSE(saved.gradients.empty());
  const std::string bytes = serialize_stage_state(saved);
  auto parsed = parse_stage_state(bytes.data(), bytes.size(), &error);
  ASSERT_TRUE(parsed) << error;
  ASSERT_TRUE(second->load_state(*parsed, false, &error)) << error;
  EXPECT_EQ(second->version(), 2);
  for (uint64_t key = 5; key < 9; ++key) {
    run_key(*first, key);
    run_key(*second, key);
  }
  const stage_state left = first->save_state(), right = second->save_state();
  EXPECT_EQ(left.weight_version, right.weight_version);
  expect_equal(left.parameters, right.parameters);
  expect_equal(left.optimizer_state, right.optimizer_state);
  expect_equal(left.gradients, right.gradients);
}

TEST(StageStateTest, MismatchedStateIsRefusedAndChangesNothing) {
  job_config config =
      testing::small_pipeline_job(2, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64);
  std::string error;
  auto ranges = partition_model(config, &error);
  auto backend = layers::create_backend("cpu", 1, &error);
  auto device = make_layers_stage_device(config, (*ranges)[0], *backend);
  stage_settings settings;
  settings.index = 0;
  settings.count = 2;
  stage_logic logic(settings, *device);
  const stage_state before = logic.save_state();

  stage_state wrong_stage = before;
  wrong_stage.stage = 1;
  EXPECT_FALSE(logic.load_state(wrong_stage, false, &error));
  EXPECT_NE(error.find("stage 1 of 2"), std::string::npos) << error;

  stage_state wrong_shape = before;
  wrong_shape.parameters[0].dims[0] += 1;
  wrong_shape.parameters[0].values.resize(layers::element_count(wrong_shape.parameters[0].dims));
  std::fill(wrong_shape.parameters[1].values.begin(), wrong_shape.parameters[1].values.end(), 5.0f);
  EXPECT_FALSE(logic.load_state(wrong_shape, false, &error));
  EXPECT_NE(error.find(before.parameters[0].name), std::string::npos) << error;
  EXPECT_NE(error.find("shape"), std::string::npos) << error;

  stage_state wrong_name = before;
  wrong_name.parameters[0].name = "conv9.weight";
  EXPECT_FALSE(logic.load_state(wrong_name, false, &error));
  EXPECT_NE(error.find("conv9.weight"), std::string::npos) << error;

  expect_equal(logic.save_state().parameters, before.parameters);
}

}  // namespace
}  // namespace troupe::actors
