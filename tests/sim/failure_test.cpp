// Checkpoints and worker failures in virtual time: a checkpoint costs the storage's time for
// the stages' state, and a failed worker sends the run back to its latest checkpoint through
// the same training_run and stage_logic code a real recovery uses, which in sync mode ends with
// exactly the weights of the run that never failed.

#include <gtest/gtest.h>

#include <string>

#include "tests/sim/simulation_fixtures.h"

namespace troupe::sim {
namespace {

cluster_model with_storage(cluster_model cluster, double bandwidth, double latency_s) {
  cluster.storage_bandwidth = bandwidth;
  cluster.storage_latency_s = latency_s;
  return cluster;
}

TEST(SimulatedFailureTest, CheckpointsCostTheStoragesTimeForTheStagesState) {
  actors::job_config config = balanced_job(4, 4, actors::pipeline_mode::sync);
  config.checkpoint.interval_steps = 10;  // 50 steps: checkpoints at 10, 20, 30, 40, 50
  const double free = simulated(config, ideal_cluster(4)).virtual_s;
  const simulation_result slow = simulated(config, with_storage(ideal_cluster(4), 1e8, 0.01));
  const simulation_result fast = simulated(config, with_storage(ideal_cluster(4), 2e8, 0.01));
  EXPECT_EQ(slow.checkpoints, 5);
  EXPECT_EQ(fast.checkpoints, 5);
  // The fixed cost is paid per checkpoint; the rest is bytes over bandwidth.
  const double slow_transfer = slow.checkpoint_s / 5 - 0.01;
  const double fast_transfer = fast.checkpoint_s / 5 - 0.01;
  EXPECT_GT(slow_transfer, 0);
  EXPECT_NEAR(slow_transfer, 2 * fast_transfer, 1e-9);
  // A sync pipeline is drained at every checkpoint: writing adds its time exactly.
  EXPECT_NEAR(slow.virtual_s - free, slow.checkpoint_s, 1e-9);
  EXPECT_EQ(simulated(config, ideal_cluster(4)).checkpoint_s, 0);
}

/// numerics_job() with a checkpoint every 7 steps.
actors::job_config numerics_job_with_checkpoints() {
  actors::job_config config = numerics_job();
  config.checkpoint.interval_steps = 7;
  return config;
}

TEST(SimulatedFailureTest, ASyncRunRecoveredFromACheckpointEndsWithTheSameModel) {
  const actors::job_config config = numerics_job_with_checkpoints();
  const cluster_model cluster = with_storage(ideal_cluster(3), 1e9, 0.001);
  simulation_options options;
  options.numerics = true;
  const simulation_result steady = simulated(config, cluster, options);
  ASSERT_EQ(steady.restarts, 0);
  options.failures = {{1, 0.6 * steady.virtual_s}};
  options.detection_s = 0.5;
  options.restart_s = 0.25;
  const simulation_result failed = simulated(config, cluster, options);
  EXPECT_EQ(failed.restarts, 1);
  EXPECT_GT(failed.lost_steps, 0);
  EXPECT_LE(failed.lost_steps, config.checkpoint.interval_steps);  // the next may be half-written
  EXPECT_GE(failed.recovery_s, 0.75);
  EXPECT_GT(failed.virtual_s, steady.virtual_s + 0.75);
  EXPECT_EQ(failed.summary.steps, steady.summary.steps);
  EXPECT_LT(failed.summary.samples_per_s, steady.summary.samples_per_s);  // lost time counts
  EXPECT_NE(failed.trace_hash, steady.trace_hash);
  // The same math from the same checkpoint: the final model is the same to the last bit.
  EXPECT_EQ(failed.summary.final_test_loss, steady.summary.final_test_loss);
  EXPECT_EQ(failed.summary.final_test_accuracy, steady.summary.final_test_accuracy);
}

TEST(SimulatedFailureTest, WithoutACheckpointARunStartsOverFromItsInitialWeights) {
  const actors::job_config config = numerics_job();
  simulation_options options;
  options.numerics = true;
  const simulation_result steady = simulated(config, ideal_cluster(3), options);
  options.failures = {{2, 0.5 * steady.virtual_s}};
  const simulation_result failed = simulated(config, ideal_cluster(3), options);
  EXPECT_EQ(failed.restarts, 1);
  EXPECT_EQ(failed.checkpoints, 0);
  EXPECT_GT(failed.lost_steps, steady.summary.steps / 3);
  EXPECT_EQ(failed.summary.final_test_loss, steady.summary.final_test_loss);
}

TEST(SimulatedFailureTest, AFailureWhileStagesHoldTheirStepForTheClippingTotalRecovers) {
  // Global clipping (sync, 4 stages, one key per step): stage 3 holds each step from the end
  // of its backward pass until stage 0's step message brings every stage's norm, the second
  // half of the step or so. Failures at eight moments across one step (some in a hold, some
  // not) must each recover and finish the run.
  actors::job_config config = balanced_job(4, 1, actors::pipeline_mode::sync);
  config.training.clip_norm = 0.5;
  const cluster_model cluster = ideal_cluster(4);
  const simulation_result steady = simulated(config, cluster);
  ASSERT_EQ(steady.summary.steps, 50);
  std::string error;
  auto data = actors::load_job_data(config, &error);
  ASSERT_TRUE(data) << error;
  const double step_s = steady.virtual_s / 50;
  for (int moment = 0; moment < 8; ++moment) {
    simulation_options options;
    options.failures = {{1, 0.5 * steady.virtual_s + moment * step_s / 8}};
    actors::quiet_observer observer;
    auto failed = simulate(config, *data, cluster, options, observer, &error);
    ASSERT_TRUE(failed) << "failure " << moment << "/8 of a step in: " << error;
    EXPECT_EQ(failed->restarts, 1);
    EXPECT_EQ(failed->summary.steps, 50);
  }
}

TEST(SimulatedFailureTest, AFailurePastMaxRestartsEndsTheRunNamingTheWorker) {
  actors::job_config config = balanced_job(4, 4, actors::pipeline_mode::async);
  config.checkpoint.max_restarts = 1;
  const cluster_model cluster = ideal_cluster(4);
  const double length = simulated(config, cluster).virtual_s;
  simulation_options options;
  options.failures = {{3, 0.1 * length}, {2, 0.2 * length}};
  options.detection_s = 0;
  options.restart_s = 0;
  std::string error;
  auto data = actors::load_job_data(config, &error);
  ASSERT_TRUE(data) << error;
  actors::quiet_observer observer;
  EXPECT_FALSE(simulate(config, *data, cluster, options, observer, &error));
  EXPECT_NE(error.find("node/gpu2 (stages [2])"), std::string::npos) << error;
  EXPECT_NE(error.find("checkpoint.max_restarts = 1"), std::string::npos) << error;

  options.failures = {{3, 0.1 * length}};
  const simulation_result once = simulated(config, cluster, options);
  EXPECT_EQ(once.restarts, 1);
  EXPECT_EQ(once.summary.steps, 50);
}

TEST(SimulatedFailureTest, AFailureOfADeviceWithoutStagesIsRefused) {
  const actors::job_config config = balanced_job(2, 1, actors::pipeline_mode::sync);
  simulation_options options;
  options.failures = {{3, 0.001}};
  std::string error;
  auto data = actors::load_job_data(config, &error);
  ASSERT_TRUE(data) << error;
  actors::quiet_observer observer;
  EXPECT_FALSE(simulate(config, *data, ideal_cluster(4), options, observer, &error));
  EXPECT_NE(error.find("device 3, which hosts no stage"), std::string::npos) << error;
}

}  // namespace
}  // namespace troupe::sim
