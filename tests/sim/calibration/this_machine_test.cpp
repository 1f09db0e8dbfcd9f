// This machine as a simulated cluster, and the fit of the share of its cores that stage
// processes get when they outnumber them.

#include "sim/calibration/this_machine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "tests/sim/simulation_fixtures.h"

namespace troupe::sim {
namespace {

int cores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

/// A measured-looking profile of balanced_job()'s blocks: 1 ms per linear block each way.
machine_profile hand_profile(const actors::job_config& config) {
  machine_profile profile;
  profile.backend = "cpu";
  profile.batch = config.training.batch_size / config.parallelism.micro_batches;
  for (const layers::layer_spec& layer : config.model.layers) {
    const bool linear = layer.type == "linear";
    profile.blocks.push_back({layer.type, linear ? 1e-3 : 0, linear ? 1e-3 : 0, linear ? 0.5e-3 : 0,
                              linear ? 0.1e-3 : 0, 0, 0});
  }
  profile.loss_s = 10e-6;
  profile.link_latency_s = 50e-6;
  profile.link_bandwidth = 5e9;
  profile.ipc_message_cpu_s = 20e-6;
  return profile;
}

/// Keys per second that the simulator trains `config` at on this machine with a process per
/// stage, at time_slice_efficiency `efficiency`, over a run long enough to hide its fill.
double simulated_keys_per_s(const actors::job_config& config, machine_profile profile,
                            double efficiency) {
  profile.time_slice_efficiency = efficiency;
  std::string error;
  auto machine = this_machine(profile, /*in_process=*/false, &error);
  EXPECT_TRUE(machine) << error;
  simulation_options settings;
  settings.profile = profile;
  settings.message_cpu_s = profile.ipc_message_cpu_s;
  const simulation_result result = simulated(config, *machine, settings);
  return result.summary.samples_per_s / static_cast<double>(profile.batch);
}

TEST(ThisMachineTest, IsOnePooledNodeWithADevicePerCoreTimeSlicedOnlyAcrossProcesses) {
  actors::job_config job = balanced_job(2, 1, actors::pipeline_mode::async);
  machine_profile profile = hand_profile(job);
  profile.time_slice_efficiency = 0.7;
  std::string error;
  auto processes = this_machine(profile, /*in_process=*/false, &error);
  ASSERT_TRUE(processes) << error;
  ASSERT_EQ(static_cast<int>(processes->devices.size()), cores());
  EXPECT_TRUE(processes->devices[0].time_sliced);
  EXPECT_EQ(processes->devices[0].time_slice_efficiency, 0.7);
  auto threads = this_machine(profile, /*in_process=*/true, &error);
  ASSERT_TRUE(threads) << error;
  EXPECT_FALSE(threads->devices[0].time_sliced);
}

TEST(ThisMachineTest, FittedEfficiencyMakesTheSimulatorTrainAtTheMeasuredRate) {
  actors::job_config job = balanced_job(cores() + 1, 1, actors::pipeline_mode::async);
  job.parallelism.max_active_keys = cores() + 1;
  job.data.synthetic_train = 400 * job.training.batch_size;
  const machine_profile profile = hand_profile(job);
  std::string error;
  auto fastest = fit_time_slice_efficiency(job, profile, 1e9, &error);
  ASSERT_TRUE(fastest) << error;
  EXPECT_EQ(*fastest, 1.0);
  auto slowest = fit_time_slice_efficiency(job, profile, 1e-3, &error);
  ASSERT_TRUE(slowest) << error;
  EXPECT_EQ(*slowest, 0.05);
  // A stand-in that ran as fast as the simulator does at a share of 0.6: the fit finds 0.6.
  const double rate = simulated_keys_per_s(job, profile, 0.6);
  auto fitted = fit_time_slice_efficiency(job, profile, rate, &error);
  ASSERT_TRUE(fitted) << error;
  std::printf("%d stages on %d cores: %.1f keys/s at a share of 0.6, fitted back to %.3f\n",
              cores() + 1, cores(), rate, *fitted);
  EXPECT_NEAR(*fitted, 0.6, 0.03);
  auto slower = fit_time_slice_efficiency(job, profile, 0.8 * rate, &error);
  ASSERT_TRUE(slower) << error;
  EXPECT_LT(*slower, *fitted - 0.05);
}

TEST(ThisMachineTest, TheFitSimulatesTheStandInWithoutTheWorksSpread) {
  // The stand-in's stages spin for exactly their times: a profile whose real work spreads
  // widely fits the same share as one whose work does not, where a fit that simulated the
  // spread would need another share to make up for what the spread does to the rate.
  actors::job_config job = balanced_job(cores() + 1, 1, actors::pipeline_mode::async);
  job.parallelism.max_active_keys = cores() + 1;
  job.data.synthetic_train = 400 * job.training.batch_size;
  const machine_profile steady = hand_profile(job);
  machine_profile spread = steady;
  spread.work_jitter = 1;
  const double rate = simulated_keys_per_s(job, steady, 0.6);
  // The spread changes the simulated pipeline's rate: a fit that simulated it would differ.
  ASSERT_GT(std::abs(simulated_keys_per_s(job, spread, 0.6) / rate - 1), 0.01);
  std::string error;
  auto without = fit_time_slice_efficiency(job, steady, rate, &error);
  ASSERT_TRUE(without) << error;
  auto with = fit_time_slice_efficiency(job, spread, rate, &error);
  ASSERT_TRUE(with) << error;
  EXPECT_DOUBLE_EQ(*with, *without);
}

TEST(ThisMachineTest, APipelineThatKeepsNoMoreStagesBusyThanCoresKeepsTheFullShare) {
  // One key in flight keeps one stage busy: a slow stand-in says nothing about time slicing,
  // and pushing the share to its bound would price other jobs' shared cores at 1/20.
  actors::job_config job = balanced_job(cores() + 1, 1, actors::pipeline_mode::async);
  job.parallelism.max_active_keys = 1;
  const machine_profile profile = hand_profile(job);
  const double full = simulated_keys_per_s(job, profile, 1.0);
  EXPECT_GT(simulated_keys_per_s(job, profile, 0.05), 0.9 * full);
  std::string error;
  auto fitted = fit_time_slice_efficiency(job, profile, 0.5 * full, &error);
  ASSERT_TRUE(fitted) << error;
  EXPECT_EQ(*fitted, 1.0);
}

TEST(ThisMachineTest, SyncFlushNeedsALowerShareThanTheRateLost) {
  // Sync mode drains every step, and while fewer stages work than there are cores the
  // simulator's pool runs at full speed: losing 20% of the rate takes a share below 0.8.
  actors::job_config job = balanced_job(cores() + 1, 4, actors::pipeline_mode::sync);
  const machine_profile profile = hand_profile(job);
  const double fair = simulated_keys_per_s(job, profile, 1.0);
  std::string error;
  auto fitted = fit_time_slice_efficiency(job, profile, 0.8 * fair, &error);
  ASSERT_TRUE(fitted) << error;
  std::printf("sync, %d stages on %d cores: 80%% of %.1f keys/s takes a share of %.3f\n",
              cores() + 1, cores(), fair, *fitted);
  EXPECT_LT(*fitted, 0.78);
  EXPECT_GT(*fitted, 0.05);
}

}  // namespace
}  // namespace troupe::sim
