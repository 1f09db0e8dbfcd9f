// One stage's state machine (stage_logic) on its own: when it steps, the order of a fixed
// schedule's passes, the messages it refuses.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "actors/engine/partition.h"
#include "actors/engine/pass_order.h"
#include "actors/engine/stage_logic.h"
#include "actors/engine/stage_settings.h"
#include "layers/backend_registry.h"
#include "tests/support/job_helpers.h"
#include "tests/support/test_helpers.h"

namespace troupe::actors {
namespace {

std::string* nullptr_error() {
  static std::string error;
  return &error;
}

job_config small_job(int stages, int micro_batches, pipeline_mode mode,
                     pipeline_schedule schedule) {
  return testing::small_pipeline_job(stages, micro_batches, mode, schedule, 640);
}

/// The last stage of a 2-stage `config` on a CPU backend, and a forward key for it.
struct last_stage {
  explicit last_stage(const job_config& config)
      : device(testing::cpu_backend()),
        work(make_layers_stage_device(config, (*partition_model(config, nullptr_error()))[1],
                                      *device)),
        logic(stage_settings_of(config, 1, 10, 10, make_pass_turns(config)), *work) {}

  key_message forward(layers::shape dims) const {
    key_message message;
    message.kind = key_kind::forward;
    message.labels = std::make_shared<const std::vector<int32_t>>(dims[0], 1);
    message.payload = layers::tensor::filled(*device, device->default_stream(), dims, 0.5f);
    return message;
  }

  std::unique_ptr<layers::backend> device;
  std::unique_ptr<stage_device> work;  ///< the stage's device work
  stage_logic logic;
};

TEST(StageLogicTest, ZeroBubbleRunsPassesInItsOrder) {
  // The last of 2 stages, 2 micro-batches: F0 B0 F1 B1 W0 W1. F1 comes first and waits; W
  // wait until the host asks for the ready work, after it sent what B produced.
  last_stage stage(small_job(2, 2, pipeline_mode::sync, pipeline_schedule::zb_h1));
  stage_logic& last = stage.logic;
  stage_device* last_device = stage.work.get();
  key_message first = stage.forward({8, 20});
  key_message second = first;
  second.key = 1;
  EXPECT_TRUE(last.handle(second).empty());
  EXPECT_FALSE(last.has_ready_work());  // F0 is next
  auto outputs = last.handle(first);
  ASSERT_EQ(outputs.size(), 2u);  // the loss, and the input gradient for stage 0
  EXPECT_EQ(outputs[1].what, stage_output::kind::to_previous_stage);
  EXPECT_EQ(outputs[1].message.key, 0u);
  for (layers::parameter* p : last_device->parameters()) EXPECT_FALSE(p->has_gradient);
  ASSERT_TRUE(last.has_ready_work());  // F1, which came early
  outputs = last.run_ready_work();
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[1].message.key, 1u);
  for (layers::parameter* p : last_device->parameters()) EXPECT_FALSE(p->has_gradient);
  ASSERT_TRUE(last.has_ready_work());  // W0
  EXPECT_TRUE(last.run_ready_work().empty());
  for (layers::parameter* p : last_device->parameters()) EXPECT_TRUE(p->has_gradient);
  EXPECT_EQ(last.version(), 0);
  ASSERT_TRUE(last.has_ready_work());  // W1, and the step
  EXPECT_TRUE(last.run_ready_work().empty());
  EXPECT_EQ(last.version(), 1);
  EXPECT_FALSE(last.has_ready_work());
}

TEST(StageLogicTest, InterleavedChunksOfAWorkerTakeTurns) {
  // Stages 1 and 3 of 4 share worker 1 (2 workers, 2 chunks, 2 micro-batches): stage 3's
  // forward waits until stage 1 has run both of its forwards.
  job_config config = small_job(4, 2, pipeline_mode::sync, pipeline_schedule::interleaved);
  config.parallelism.virtual_stages = 2;
  const auto turns = make_pass_turns(config);
  ASSERT_EQ(turns.size(), 2u);
  auto device = testing::cpu_backend();
  auto ranges = partition_model(config, nullptr_error());
  ASSERT_TRUE(ranges);
  auto chunk_1 = make_layers_stage_device(config, (*ranges)[1], *device);
  auto chunk_3 = make_layers_stage_device(config, (*ranges)[3], *device);
  ASSERT_EQ((*ranges)[1].first, 2u);
  ASSERT_EQ((*ranges)[3].first, 6u);
  stage_logic stage_1(stage_settings_of(config, 1, 10, 10, turns), *chunk_1);
  stage_logic stage_3(stage_settings_of(config, 3, 10, 10, turns), *chunk_3);
  // Micro-batches of 8; stage 1 (dropout, linear) takes the tanh's 24 features, stage 3 (gelu,
  // linear) the 16 of the linear before it.
  const auto input = [&](int64_t features, uint64_t key) {
    key_message message;
    message.kind = key_kind::forward;
    message.key = key;
    message.labels = std::make_shared<const std::vector<int32_t>>(8, 1);
    message.payload =
        layers::tensor::filled(*device, device->default_stream(), {8, features}, 0.5f);
    return message;
  };
  std::string refusal;
  EXPECT_TRUE(stage_3.handle(input(16, 0), &refusal).empty());  // stage 1's F0 and F1 first
  EXPECT_EQ(refusal, "");
  EXPECT_EQ(stage_1.stage_with_next_pass(), 1);
  EXPECT_FALSE(stage_3.has_ready_work());
  EXPECT_EQ(stage_1.handle(input(24, 0), &refusal).size(), 1u) << refusal;
  EXPECT_FALSE(stage_3.has_ready_work());
  EXPECT_EQ(stage_1.handle(input(24, 1), &refusal).size(), 1u) << refusal;
  EXPECT_EQ(stage_1.stage_with_next_pass(), 3);
  ASSERT_TRUE(stage_3.has_ready_work());
  const auto outputs = stage_3.run_ready_work();  // F and B of micro-batch 0 at the last stage
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[1].what, stage_output::kind::to_previous_stage);
  EXPECT_EQ(stage_3.stage_with_next_pass(), 3);  // F3.1 next
}

TEST(StageLogicTest, RefusesMessagesThatDoNotFit) {
  last_stage stage(small_job(2, 1, pipeline_mode::async, pipeline_schedule::gpipe));
  stage_logic& last = stage.logic;
  layers::backend* device = stage.device.get();
  const key_message wrong_shape = stage.forward({4, 7});
  std::string refusal;
  EXPECT_TRUE(last.handle(wrong_shape, &refusal).empty());
  EXPECT_NE(refusal.find("does not fit"), std::string::npos) << refusal;
  key_message unknown_backward;
  unknown_backward.kind = key_kind::backward;
  unknown_backward.key = 99;
  unknown_backward.payload =
      layers::tensor::filled(*device, device->default_stream(), {4, 4}, 1.0f);
  refusal.clear();
  EXPECT_TRUE(last.handle(unknown_backward, &refusal).empty());
  EXPECT_NE(refusal.find("never forwarded"), std::string::npos) << refusal;
  EXPECT_EQ(last.refused(), 2);
  EXPECT_EQ(last.version(), 0);
}

TEST(StageLogicTest, RefusesLabelsOutsideTheClassesInsteadOfAborting) {
  // A peer's label past the logits' row used to reach the loss kernel's check and abort the
  // worker; it is refused like any message that does not fit, and the stage goes on.
  last_stage stage(small_job(2, 1, pipeline_mode::async, pipeline_schedule::gpipe));
  const int64_t classes = stage.work->classes();
  ASSERT_GT(classes, 1);
  for (const int32_t bad : {static_cast<int32_t>(classes), -3}) {
    key_message forged = stage.forward({8, 20});
    std::vector<int32_t> labels(8, 1);
    labels[5] = bad;
    forged.labels = std::make_shared<const std::vector<int32_t>>(labels);
    std::string refusal;
    EXPECT_TRUE(stage.logic.handle(forged, &refusal).empty());
    EXPECT_NE(refusal.find("label " + std::to_string(bad) +
                           " (row 5 of key 0) is outside the "
                           "model's " +
                           std::to_string(classes) + " classes"),
              std::string::npos)
        << refusal;
  }
  EXPECT_EQ(stage.logic.refused(), 2);
  std::string refusal;
  EXPECT_EQ(stage.logic.handle(stage.forward({8, 20}), &refusal).size(), 2u) << refusal;
}

std::vector<std::vector<float>> weights_of(last_stage& stage) {
  std::vector<std::vector<float>> result;
  for (layers::parameter* p : stage.work->parameters()) {
    result.push_back(p->value.to_host(stage.device->default_stream()));
  }
  return result;
}

TEST(StageLogicTest, SyncStageSendsItsLastInputGradientBeforeItSteps) {
  // One key per step: its backward completes the step. The input gradient leaves first; the
  // step waits for the host's ready work, or for the next pass.
  last_stage stepped(small_job(2, 1, pipeline_mode::sync, pipeline_schedule::one_f_one_b));
  last_stage unstepped(small_job(2, 1, pipeline_mode::sync, pipeline_schedule::one_f_one_b));
  const auto before = weights_of(stepped);
  auto outputs = stepped.logic.handle(stepped.forward({8, 20}));
  ASSERT_EQ(outputs.size(), 2u);  // the loss, and the input gradient for stage 0
  EXPECT_EQ(outputs[1].what, stage_output::kind::to_previous_stage);
  EXPECT_EQ(stepped.logic.version(), 0);
  EXPECT_EQ(weights_of(stepped), before);
  ASSERT_TRUE(stepped.logic.has_ready_work());  // the step
  EXPECT_TRUE(stepped.logic.run_ready_work().empty());
  EXPECT_EQ(stepped.logic.version(), 1);
  EXPECT_NE(weights_of(stepped), before);
  EXPECT_FALSE(stepped.logic.has_ready_work());

  // A stage whose host has not run the step yet takes it before its next pass: the next key
  // meets the same weights either way.
  unstepped.logic.handle(unstepped.forward({8, 20}));
  key_message second = stepped.forward({8, 20});
  second.key = 1;
  const auto after_ready_work = stepped.logic.handle(second);
  second.payload = unstepped.forward({8, 20}).payload;
  const auto after_next_pass = unstepped.logic.handle(second);
  ASSERT_EQ(after_ready_work.size(), 2u);
  ASSERT_EQ(after_next_pass.size(), 2u);
  EXPECT_EQ(after_ready_work[0].loss_sum, after_next_pass[0].loss_sum);
  EXPECT_EQ(after_ready_work[1].message.payload.to_host(stepped.device->default_stream()),
            after_next_pass[1].message.payload.to_host(unstepped.device->default_stream()));
  EXPECT_EQ(unstepped.logic.version(), 1);  // and the second step is due
  EXPECT_TRUE(unstepped.logic.has_ready_work());
}

TEST(StageLogicTest, ALoadedStateForgetsAStepHeldForTheClippingTotal) {
  // Global clipping (sync, several stages): the last stage's backward completes its step and
  // holds it until stage 0's step message brings every stage's norm. A pipeline reset then (a
  // recovery loading the latest checkpoint) must leave it taking keys as at that checkpoint.
  job_config config = small_job(2, 1, pipeline_mode::sync, pipeline_schedule::one_f_one_b);
  config.training.clip_norm = 0.5;
  last_stage stage(config);
  const stage_state checkpoint = stage.logic.save_state();
  const auto first = stage.logic.handle(stage.forward({8, 20}));
  ASSERT_EQ(first.size(), 2u);  // the loss, and the input gradient carrying this stage's norm
  EXPECT_GT(first[1].message.norm_squared, 0);
  std::string refusal;
  EXPECT_TRUE(stage.logic.handle(stage.forward({8, 20}), &refusal).empty());
  EXPECT_NE(refusal.find("waits for its step message"), std::string::npos) << refusal;

  std::string error;
  ASSERT_TRUE(stage.logic.load_state(checkpoint, false, &error)) << error;
  refusal.clear();
  const auto again = stage.logic.handle(stage.forward({8, 20}), &refusal);
  ASSERT_EQ(again.size(), 2u) << refusal;
  EXPECT_EQ(again[0].loss_sum, first[0].loss_sum);  // the checkpoint's weights
  EXPECT_EQ(again[1].message.norm_squared, first[1].message.norm_squared);  // fresh gradients
  EXPECT_EQ(stage.logic.version(), 0);
  EXPECT_EQ(stage.logic.refused(), 1);
}

TEST(StageLogicTest, AsyncStageStepsWithinItsPass) {
  last_stage stage(small_job(2, 1, pipeline_mode::async, pipeline_schedule::gpipe));
  stage.logic.handle(stage.forward({8, 20}));
  EXPECT_EQ(stage.logic.version(), 1);
  EXPECT_FALSE(stage.logic.has_ready_work());
}

}  // namespace
}  // namespace troupe::actors
