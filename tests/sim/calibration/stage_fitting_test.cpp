#include "sim/calibration/stage_fitting.h"

#include <gtest/gtest.h>

#include "actors/config/job_file.h"
#include "layers/model.h"
#include "sim/cost_model.h"

namespace troupe::sim {
namespace {

/// flatten, linear, relu, linear, relu, linear: an MLP whose first block has no parameters.
actors::job_config mlp_job(int stages) {
  const std::string text = R"(
[model]
input_shape = [1, 8, 8]
layers = [{ type = "flatten" }, { type = "linear", out = 32 }, { type = "relu" },
          { type = "linear", out = 32 }, { type = "relu" }, { type = "linear", out = 10 }]
[data]
dataset = "synthetic"
classes = 10
[parallelism]
stages = )" + std::to_string(stages) +
                           R"(
[training]
batch_size = 16
)";
  actors::job_error problem;
  auto config = actors::parse_job(text, "mlp", {}, &problem);
  EXPECT_TRUE(config) << problem.message;
  return *config;
}

/// Blocks timed alone: a parameterless block's backward costs the same with or without its
/// input gradient; a linear block's input gradient costs as much as its weight gradient.
std::vector<block_profile> blocks_alone(const actors::job_config& config) {
  std::vector<block_profile> blocks;
  for (const layers::layer_spec& spec : config.model.layers) {
    block_profile block;
    block.type = spec.type;
    const bool linear = spec.type == "linear";
    block.forward_s = linear ? 1.0 : 0.1;
    block.backward_s = linear ? 2.0 : 0.1;
    block.backward_first_s = linear ? 1.0 : 0.1;
    block.step_s = linear ? 0.5 : 0;
    blocks.push_back(block);
  }
  return blocks;
}

/// What the simulator charges the blocks `range` of `blocks` for one key's backward of 16
/// samples (the job's batch, at which they were "measured"), on the first stage or a later one.
double charged_backward_s(const actors::job_config& config,
                          const std::vector<block_profile>& blocks, actors::stage_range range,
                          bool first_stage) {
  std::string error;
  auto work = model_work(config, &error);
  EXPECT_TRUE(work) << error;
  stage_cost cost(std::vector<block_work>(work->begin() + range.first, work->begin() + range.last),
                  kernel_work{}, device_model{});
  cost.use_measured(
      std::vector<block_profile>(blocks.begin() + range.first, blocks.begin() + range.last), 16, 0);
  return cost.backward_s(16, !first_stage);
}

TEST(StageFittingTest,
     TheFirstStagesBlocksAddUpToItsMeasuredBackwardWithoutTheFirstLinearsInputGradient) {
  const actors::job_config config = mlp_job(1);
  std::vector<block_profile> blocks = blocks_alone(config);
  // The stage as the engine runs it: the first linear computes no input gradient, so alone its
  // blocks' backward is 0.1 + 1 + 0.1 + 2 + 0.1 + 2 = 5.3; measured 20% slower in a stage.
  stage_timing stage;
  stage.range = {0, blocks.size()};
  stage.forward_s = 3.9;
  stage.backward_s = 1.2 * 5.3;
  stage.step_s = 1.5;
  fit_blocks_to_stages(config, {stage}, &blocks);
  EXPECT_NEAR(charged_backward_s(config, blocks, stage.range, true), stage.backward_s, 1e-9);
  // Every block slowed alike, the first linear's weight gradient included.
  EXPECT_NEAR(blocks[1].backward_first_s, 1.2, 1e-9);
  EXPECT_NEAR(blocks[3].backward_s, 2.4, 1e-9);
  double forward = 0, step = 0;
  for (const block_profile& block : blocks) {
    forward += block.forward_s;
    step += block.step_s;
  }
  EXPECT_NEAR(forward, 3.9, 1e-9);
  EXPECT_NEAR(step, 1.5, 1e-9);
}

TEST(StageFittingTest, LaterStagesFitWithEveryInputGradient) {
  const actors::job_config config = mlp_job(2);
  std::vector<block_profile> blocks = blocks_alone(config);
  stage_timing first, second;
  first.range = {0, 3};   // flatten, linear, relu: 0.1 + 1 + 0.1 alone
  second.range = {3, 6};  // linear, relu, linear: 2 + 0.1 + 2 alone
  first.backward_s = 1.2;
  second.backward_s = 2 * 4.1;
  fit_blocks_to_stages(config, {first, second}, &blocks);
  EXPECT_NEAR(charged_backward_s(config, blocks, first.range, true), 1.2, 1e-9);
  EXPECT_NEAR(charged_backward_s(config, blocks, second.range, false), 8.2, 1e-9);
  EXPECT_NEAR(blocks[1].backward_first_s, 1.0, 1e-9);  // measured as timed alone
  EXPECT_NEAR(blocks[5].backward_s, 4.0, 1e-9);
}

}  // namespace
}  // namespace troupe::sim
