// A checkpoint cut into other stages: every tensor joined by name (a cut layer's parts row after
// row) and cut again at the new partition, cuts inside a layer included.

#include "actors/storage/checkpoint_recut.h"

#include <gtest/gtest.h>

#include "actors/config/layer_cuts.h"
#include "actors/storage/model_weights.h"
#include "tests/support/job_helpers.h"

namespace troupe::actors {
namespace {

/// small_pipeline_job on `stages` stages cut at `partition`.
job_config job_cut(int stages, const std::string& partition) {
  job_config config =
      testing::small_pipeline_job(stages, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64);
  config.parallelism.partition = partition;
  EXPECT_EQ(expand_cut_points(&config), "");
  return config;
}

/// A checkpoint of `config`'s seeded weights at step 8, each parameter with a momentum
/// velocity of its own values doubled.
loaded_checkpoint checkpoint_of(const job_config& config) {
  std::string error;
  auto states = seeded_stage_states(config, &error);
  EXPECT_TRUE(states.has_value()) << error;
  loaded_checkpoint checkpoint;
  checkpoint.directory = "runs/x/checkpoints/step-8";
  checkpoint.manifest.step = 8;
  checkpoint.manifest.stages = config.parallelism.stages;
  for (stage_state& state : *states) {
    state.weight_version = state.optimizer_steps = 8;
    state.seed = 5;
    for (const named_tensor& parameter : state.parameters) {
      named_tensor velocity{parameter.name + ".velocity", parameter.dims, parameter.values};
      for (float& value : velocity.values) value *= 2;
      state.optimizer_state.push_back(velocity);
    }
    checkpoint.shards.push_back(serialize_stage_state(state));
  }
  return checkpoint;
}

TEST(CheckpointRecutTest, ACutInsideALayerGoesToTwoStagesAndBackBitForBit) {
  const job_config three = job_cut(3, "3:8,5");  // linear3's 20 rows: 8 on stage 0, 12 on 1
  const job_config two = job_cut(2, "uniform");
  const loaded_checkpoint original = checkpoint_of(three);
  ASSERT_TRUE(needs_recut(original, two));
  ASSERT_FALSE(needs_recut(original, three));
  std::string error;
  const auto halved = recut_checkpoint(original, two, &error);
  ASSERT_TRUE(halved.has_value()) << error;
  ASSERT_EQ(halved->shards.size(), 2u);
  EXPECT_EQ(halved->manifest.stages, 2);
  ASSERT_EQ(halved->manifest.shards.size(), 2u);
  EXPECT_EQ(halved->manifest.shards[1].bytes, halved->shards[1].size());
  std::vector<named_tensor> whole;
  for (const std::string& shard : halved->shards) {
    auto state = parse_stage_state(shard.data(), shard.size(), &error);
    ASSERT_TRUE(state.has_value()) << error;
    EXPECT_EQ(state->weight_version, 8);
    EXPECT_EQ(state->optimizer_steps, 8);
    EXPECT_EQ(state->seed, 5u);
    EXPECT_EQ(state->optimizer_state.size(), state->parameters.size());
    for (const named_tensor& parameter : state->parameters) whole.push_back(parameter);
  }
  // linear3 whole again, its rows those of the two parts in order.
  const auto seeded = seeded_stage_states(three, &error);
  ASSERT_TRUE(seeded.has_value()) << error;
  std::vector<float> rows = (*seeded)[0].parameters[2].values;
  const std::vector<float>& tail = (*seeded)[1].parameters[0].values;
  rows.insert(rows.end(), tail.begin(), tail.end());
  bool found = false;
  for (const named_tensor& parameter : whole) {
    if (parameter.name != "linear3.weight") continue;
    found = true;
    EXPECT_EQ(parameter.dims, (layers::shape{20, 24}));
    EXPECT_EQ(parameter.values, rows);
  }
  EXPECT_TRUE(found);
  const auto back = recut_checkpoint(*halved, three, &error);
  ASSERT_TRUE(back.has_value()) << error;
  EXPECT_EQ(back->shards, original.shards);
}

TEST(CheckpointRecutTest, StagesAtOtherVersionsOrWithGradientsAreRefusedByName) {
  const job_config four = job_cut(4, "uniform");
  const job_config two = job_cut(2, "uniform");
  loaded_checkpoint checkpoint = checkpoint_of(four);
  std::string error;
  auto state = parse_stage_state(checkpoint.shards[2].data(), checkpoint.shards[2].size(), &error);
  ASSERT_TRUE(state.has_value()) << error;
  state->weight_version = 7;
  checkpoint.shards[2] = serialize_stage_state(*state);
  EXPECT_FALSE(recut_checkpoint(checkpoint, two, &error));
  EXPECT_NE(error.find("runs/x/checkpoints/step-8 cannot be cut into other stages: stage 2 is "
                       "at weight version 7 where stage 0 is at 8"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("resume it with its own 4 stages"), std::string::npos) << error;
  state->weight_version = 8;
  state->keys_since_step = 1;
  checkpoint.shards[2] = serialize_stage_state(*state);
  EXPECT_FALSE(recut_checkpoint(checkpoint, two, &error));
  EXPECT_NE(error.find("stage 2 holds gradients of 1 keys towards its next step"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace troupe::actors
