// The simulator hosts the real stage and coordinator state machines in virtual time: GPipe's
// bubble comes out as the formula says, async staleness keeps its bound, a seed replays the
// same trace, and numerics mode reproduces a real sync run's losses exactly.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/engine/training_run.h"
#include "actors/hosts/pipeline_host.h"
#include "sim/calibration/calibrate.h"
#include "sim/profile.h"
#include "sim/simulation.h"
#include "tests/sim/simulation_fixtures.h"
#include "tests/support/engine_helpers.h"

namespace troupe::sim {
namespace {

using actors::quiet_observer;

/// A profile of balanced_job(2, …)'s blocks: the layernorm free, each linear block 1 ms forward
/// and 2 ms backward (1 ms without the input gradient) for keys of 32 samples; free links.
machine_profile two_linear_blocks() {
  machine_profile profile;
  profile.batch = 32;
  profile.link_bandwidth = 1e18;
  profile.blocks = {
      {"layernorm", 0, 0, 0, 0}, {"linear", 1e-3, 2e-3, 1e-3, 0}, {"linear", 1e-3, 2e-3, 1e-3, 0}};
  return profile;
}

TEST(SimulationTest, GpipeIdleFractionIsTheBubbleFormula) {
  for (int stages : {2, 4, 8}) {
    for (int micro_batches : {1, 4, 16}) {
      simulation_result result = simulated(
          balanced_job(stages, micro_batches, actors::pipeline_mode::sync), ideal_cluster(stages));
      const double expected = double(stages - 1) / (micro_batches + stages - 1);
      ASSERT_EQ(result.stage_idle_fraction.size(), static_cast<size_t>(stages));
      std::printf("S=%d M=%-2d idle fraction: stage 0 %.4f, stage %d %.4f; (S-1)/(M+S-1) %.4f\n",
                  stages, micro_batches, result.stage_idle_fraction.front(), stages - 1,
                  result.stage_idle_fraction.back(), expected);
      for (int s = 0; s < stages; ++s) {
        EXPECT_NEAR(result.stage_idle_fraction[s], expected, 0.01)
            << "S=" << stages << " M=" << micro_batches << " stage " << s;
      }
      EXPECT_EQ(result.summary.steps, 50);
    }
  }
}

/// The mean idle fraction of the `devices` ideal devices that run `config`'s stages.
double mean_idle(const actors::job_config& config, int devices) {
  const simulation_result result = simulated(config, ideal_cluster(devices));
  double busy = 0;
  for (double utilization : result.stage_utilization) busy += utilization;
  return 1 - busy / devices;
}

TEST(SimulationTest, NewerSchedulesShrinkTheBubbleAsPublished) {
  // Equal linear blocks whose forward, input gradient and weight gradient each cost t (GEMM
  // FLOPs only). 1F1B idles (p−1)·3t of m·3t + (p−1)·3t; ZB-H1 fills all but (p−1)·t of it
  // with deferred weight gradients (Qi et al. 2024: (p−1)(T_F + T_B − T_W)); interleaving v
  // chunks per worker divides it by v (Narayanan et al. 2021). Both formulas assume m ≥ p.
  // Below that, ZB-H1's stage 0 waits 2p − 1 passes for its first B and then has 2m to run:
  // its bubble is 1 − 3m / (2m + 2p − 1); interleaving needs m to be a multiple of p (as in
  // Megatron-LM) and otherwise runs passes as they come, still below 1F1B.
  const int virtual_stages = 2;
  for (int stages : {2, 4, 8}) {
    for (int micro_batches : {4, 16}) {
      const double p = stages, m = micro_batches, v = virtual_stages;
      actors::job_config config = balanced_job(stages, micro_batches, actors::pipeline_mode::sync);
      config.parallelism.schedule = actors::pipeline_schedule::one_f_one_b;
      const double one_f_one_b = mean_idle(config, stages);
      config.parallelism.schedule = actors::pipeline_schedule::zb_h1;
      const double zero_bubble = mean_idle(config, stages);
      actors::job_config chunks =
          balanced_job(stages * virtual_stages, micro_batches, actors::pipeline_mode::sync);
      chunks.parallelism.schedule = actors::pipeline_schedule::interleaved;
      chunks.parallelism.virtual_stages = virtual_stages;
      const double interleaved = mean_idle(chunks, stages);
      const bool enough = micro_batches >= stages;
      const double expected[3] = {
          (p - 1) / (m + p - 1),
          enough ? (p - 1) / (3 * m + p - 1) : 1 - 3 * m / (2 * m + 2 * p - 1),
          (p - 1) / (v * m + p - 1)};
      std::printf(
          "p=%d m=%-2d bubble: 1f1b %.4f (formula %.4f)  zb-h1 %.4f (%.4f)  "
          "interleaved v=2 %.4f (%.4f)\n",
          stages, micro_batches, one_f_one_b, expected[0], zero_bubble, expected[1], interleaved,
          expected[2]);
      EXPECT_NEAR(one_f_one_b, expected[0], 0.01) << "p=" << stages << " m=" << micro_batches;
      EXPECT_NEAR(zero_bubble, expected[1], 0.01) << "p=" << stages << " m=" << micro_batches;
      if (enough) {
        EXPECT_NEAR(interleaved, expected[2], 0.01) << "p=" << stages << " m=" << micro_batches;
      } else {
        EXPECT_LT(interleaved, one_f_one_b) << "p=" << stages << " m=" << micro_batches;
      }
    }
  }
}

TEST(SimulationTest, PooledDevicesRunTheirStagesOnWhicheverIsFree) {
  actors::job_config config = balanced_job(4, 1, actors::pipeline_mode::async);
  config.parallelism.max_active_keys = 4;
  config.parallelism.min_update_interval = 1;
  // Every stage placed on the first of two devices.
  const std::string on_first =
      "[placement]\nstages = [\"node/gpu0\", \"node/gpu0\", \"node/gpu0\", \"node/gpu0\"]\n";
  const double alone =
      simulated(config, ideal_cluster(2, sharing::none, on_first)).summary.samples_per_s;
  const simulation_result pooled = simulated(config, ideal_cluster(2, sharing::pooled, on_first));
  const double spread = simulated(config, ideal_cluster(2)).summary.samples_per_s;
  std::printf(
      "4 stages on one of 2 devices: %.0f samples/s; pooled %.0f; 2 stages per device %.0f\n",
      alone, pooled.summary.samples_per_s, spread);
  // The pool keeps both devices at work, at least as well as a placement that spreads the
  // stages, two on each device, does.
  EXPECT_NEAR(pooled.summary.samples_per_s / alone, 2.0, 0.05);
  EXPECT_GE(pooled.summary.samples_per_s, spread);
  // A stage still handles one message at a time, and the pool holds two devices' work.
  double total = 0;
  for (double utilization : pooled.stage_utilization) {
    EXPECT_LE(utilization, 1.0 + 1e-9);
    total += utilization;
  }
  EXPECT_LE(total, 2.0 + 1e-9);
  EXPECT_GT(total, 1.9);
}

/// The most spans of different stages that overlap at one instant of `result`'s trace.
int most_overlapping_spans(const simulation_result& result) {
  std::vector<std::pair<double, int>> edges;  // +1 at a span's start, -1 at its end
  const nlohmann::json timeline = result.trace->to_json();
  for (const auto& event : timeline["traceEvents"]) {
    // Work only: not the coordinator's track (0), nor the idle gaps between a stage's spans.
    if (event["ph"] != "X" || event["tid"] == 0 || event["name"] == "idle") continue;
    // Microseconds, rounded: spans that abut may seem to overlap by a rounding error.
    const double start = event["ts"].get<double>() + 0.01;
    edges.push_back({start, 1});
    edges.push_back({start + event["dur"].get<double>() - 0.02, -1});
  }
  std::sort(edges.begin(), edges.end());
  int now = 0;
  int most = 0;
  for (const auto& [time, change] : edges) most = std::max(most, now += change);
  return most;
}

TEST(SimulationTest, TimeSlicedStagesShareThePoolsDevicesAtOnce) {
  actors::job_config config = balanced_job(4, 1, actors::pipeline_mode::async);
  config.parallelism.max_active_keys = 4;
  config.parallelism.min_update_interval = 1;
  simulation_options options;
  options.trace_spans = 100000;
  // As many devices as stages: nobody waits and nothing is shared, as on dedicated devices.
  const simulation_result dedicated = simulated(config, ideal_cluster(4), options);
  const simulation_result roomy =
      simulated(config, ideal_cluster(4, sharing::time_sliced), options);
  EXPECT_NEAR(roomy.summary.samples_per_s, dedicated.summary.samples_per_s,
              1e-9 * dedicated.summary.samples_per_s);
  EXPECT_EQ(roomy.trace_hash, dedicated.trace_hash);
  // Four stages on two devices: a queued pool runs at most two at a time, each at full speed;
  // a time-sliced one runs every stage that has work, slower, as an OS runs their threads.
  const simulation_result queued = simulated(config, ideal_cluster(2, sharing::pooled), options);
  const simulation_result sliced =
      simulated(config, ideal_cluster(2, sharing::time_sliced), options);
  std::printf(
      "4 stages on 2 devices: queued %.0f samples/s (at most %d at once), time-sliced "
      "%.0f (at most %d at once)\n",
      queued.summary.samples_per_s, most_overlapping_spans(queued), sliced.summary.samples_per_s,
      most_overlapping_spans(sliced));
  EXPECT_EQ(most_overlapping_spans(queued), 2);
  EXPECT_GE(most_overlapping_spans(sliced), 3);
  // Both keep the two devices at work: the same stage work in all, in about the same time.
  double queued_work = 0;
  double sliced_work = 0;
  for (size_t s = 0; s < 4; ++s) {
    queued_work += queued.stage_utilization[s] * queued.virtual_s;
    sliced_work += sliced.stage_utilization[s] * sliced.virtual_s;
    EXPECT_LE(sliced.stage_utilization[s], 1.0 + 1e-9);
  }
  EXPECT_NEAR(sliced_work, queued_work, 1e-9 * queued_work);
  EXPECT_NEAR(sliced.summary.samples_per_s / queued.summary.samples_per_s, 1.0, 0.05);
  EXPECT_GT(sliced_work / sliced.virtual_s, 1.9);
}

TEST(SimulationTest, TimeSlicedStagesGetTheEfficiencyShareOfThePoolWhenTheyOutnumberIt) {
  actors::job_config config = balanced_job(4, 1, actors::pipeline_mode::async);
  config.parallelism.max_active_keys = 4;
  config.parallelism.min_update_interval = 1;
  const auto with_efficiency = [](int devices, double efficiency) {
    cluster_model cluster = ideal_cluster(devices, sharing::time_sliced);
    for (device_model& device : cluster.devices) device.time_slice_efficiency = efficiency;
    return cluster;
  };
  // As many devices as stages: the stages never outnumber them, and nothing changes.
  const simulation_result roomy = simulated(config, with_efficiency(4, 1.0));
  const simulation_result roomy_half = simulated(config, with_efficiency(4, 0.5));
  EXPECT_EQ(roomy_half.trace_hash, roomy.trace_hash);
  // Four stages on two devices: while two or more have work, they share one device's worth.
  const simulation_result fair = simulated(config, with_efficiency(2, 1.0));
  const simulation_result halved = simulated(config, with_efficiency(2, 0.5));
  const double ratio = halved.summary.samples_per_s / fair.summary.samples_per_s;
  std::printf("4 stages on 2 devices: %.0f samples/s shared fairly, %.0f at efficiency 0.5\n",
              fair.summary.samples_per_s, halved.summary.samples_per_s);
  EXPECT_LT(ratio, 0.75);
  EXPECT_GT(ratio, 0.45);
}

TEST(SimulationTest, TheShareCostsOnlyWhileTheStagesKeepEveryDeviceBusy) {
  // Three stage processes on two devices. One key in flight keeps one stage working, and the
  // device to spare absorbs the operating system's costs: the share changes nothing. Two keys
  // keep both devices busy much of the time, never outnumbering them, and pay it.
  const auto with_efficiency = [](double efficiency) {
    cluster_model cluster = ideal_cluster(2, sharing::time_sliced);
    for (device_model& device : cluster.devices) device.time_slice_efficiency = efficiency;
    return cluster;
  };
  actors::job_config config = balanced_job(3, 1, actors::pipeline_mode::async);
  config.parallelism.min_update_interval = 1;
  config.parallelism.max_active_keys = 1;
  EXPECT_EQ(simulated(config, with_efficiency(0.5)).trace_hash,
            simulated(config, with_efficiency(1.0)).trace_hash);
  config.parallelism.max_active_keys = 2;
  const double fair = simulated(config, with_efficiency(1.0)).summary.samples_per_s;
  const double halved = simulated(config, with_efficiency(0.5)).summary.samples_per_s;
  std::printf("3 stages on 2 devices, 2 keys: %.0f samples/s at a share of 1, %.0f at 0.5\n", fair,
              halved);
  EXPECT_LT(halved, 0.9 * fair);
}

TEST(SimulationTest, FixedOrdersRunOnTimeSlicedAndPooledDevices) {
  // ZB-H1's W and interleaved chunks waiting for their turn run wherever their stages run:
  // four stages time-sliced on two devices, or pooled on them, finish every step.
  for (sharing shared : {sharing::time_sliced, sharing::pooled}) {
    actors::job_config zero_bubble = balanced_job(4, 4, actors::pipeline_mode::sync);
    zero_bubble.parallelism.schedule = actors::pipeline_schedule::zb_h1;
    actors::job_config interleaved = balanced_job(4, 4, actors::pipeline_mode::sync);
    interleaved.parallelism.schedule = actors::pipeline_schedule::interleaved;
    interleaved.parallelism.virtual_stages = 2;
    for (const actors::job_config& config : {zero_bubble, interleaved}) {
      const simulation_result result = simulated(config, ideal_cluster(2, shared));
      EXPECT_EQ(result.summary.steps, 50) << to_string(config.parallelism.schedule);
    }
  }
}

TEST(SimulationTest, AsyncStalenessStaysWithinItsBound) {
  actors::job_config config = balanced_job(4, 1, actors::pipeline_mode::async);
  config.parallelism.max_active_keys = 4;
  config.parallelism.min_update_interval = 1;
  simulation_result result = simulated(config, ideal_cluster(4));
  // ceil((MAK - 1) / MUI) = 3, and a full pipeline reaches it.
  EXPECT_EQ(result.staleness_histogram.size(), 4u);
  // Per stage, as a real run reports it: the first stage waits longest for its gradients, the
  // last computes its loss and backward pass at once, and together they are the total.
  ASSERT_EQ(result.stage_staleness_histograms.size(), 4u);
  std::vector<int64_t> total(result.staleness_histogram.size(), 0);
  for (const std::vector<int64_t>& stage : result.stage_staleness_histograms) {
    for (size_t i = 0; i < stage.size(); ++i) total.at(i) += stage[i];
  }
  EXPECT_EQ(total, result.staleness_histogram);
  EXPECT_EQ(result.stage_staleness_histograms.front().size(), 4u);
  EXPECT_EQ(result.stage_staleness_histograms.back().size(), 1u);
  // Keys overlap: far less idle time than one key at a time (3/4 idle per stage).
  for (double idle : result.stage_idle_fraction) EXPECT_LT(idle, 0.4);
}

TEST(SimulationTest, TheSameSeedReplaysTheSameTraceAndStragglersDependOnIt) {
  actors::job_config config = balanced_job(4, 2, actors::pipeline_mode::async);
  const cluster_model cluster = ideal_cluster(4);
  simulation_options options;
  options.seed = 7;
  options.stragglers = {{1, 0.5, 3.0}};
  const uint64_t first = simulated(config, cluster, options).trace_hash;
  EXPECT_EQ(simulated(config, cluster, options).trace_hash, first);
  options.seed = 8;
  EXPECT_NE(simulated(config, cluster, options).trace_hash, first);
  // Without random draws the seed changes nothing.
  options.stragglers.clear();
  const uint64_t steady = simulated(config, cluster, options).trace_hash;
  options.seed = 7;
  EXPECT_EQ(simulated(config, cluster, options).trace_hash, steady);
}

TEST(SimulationTest, ASlowDeviceSlowsTheWholeSyncPipeline) {
  actors::job_config config = balanced_job(4, 4, actors::pipeline_mode::sync);
  const cluster_model cluster = ideal_cluster(4);
  const double fast = simulated(config, cluster).summary.samples_per_s;
  simulation_options options;
  options.stragglers = {{2, 1.0, 2.0}};
  const double slow = simulated(config, cluster, options).summary.samples_per_s;
  EXPECT_LT(slow, 0.8 * fast);
  EXPECT_GT(slow, 0.4 * fast);
}

TEST(SimulationTest, NumericsReproduceTheRealSyncRunsLosses) {
  actors::job_config config = numerics_job();
  config.metrics.log_interval = 5;
  std::string error;
  auto data = actors::load_job_data(config, &error);
  ASSERT_TRUE(data) << error;

  struct recorder final : actors::training_observer {
    std::vector<double> losses;
    void on_step(int64_t, int64_t, int64_t, double, double) override {}
    void on_metrics(const actors::metrics_record& record) override {
      losses.push_back(record.loss);
      if (record.test_loss) losses.push_back(*record.test_loss);
    }
  };
  recorder real, predicted;
  testing::wall_clock clock;
  ASSERT_TRUE(actors::run_pipeline(config, *data, real, clock, {}, &error)) << error;
  simulation_options options;
  options.numerics = true;
  auto result = simulate(config, *data, ideal_cluster(3), options, predicted, &error);
  ASSERT_TRUE(result) << error;
  ASSERT_EQ(predicted.losses.size(), real.losses.size());
  ASSERT_GT(real.losses.size(), 8u);
  for (size_t i = 0; i < real.losses.size(); ++i) {
    EXPECT_EQ(predicted.losses[i], real.losses[i]) << "record " << i;
  }
}

TEST(SimulationTest, AProfileSetsTheCostsAndCalibrationMeasuresThem) {
  actors::job_config config = balanced_job(2, 1, actors::pipeline_mode::async);
  config.data.synthetic_train = 640;
  std::string error;
  auto measured = calibrate(config, 0.01, &error);
  ASSERT_TRUE(measured) << error;
  ASSERT_EQ(measured->blocks.size(), 3u);  // layernorm and two linear blocks
  EXPECT_EQ(measured->blocks[1].type, "linear");
  EXPECT_GT(measured->blocks[1].forward_s, 0);
  // Both backward passes were timed; which is faster is the machine's (a loaded one inverts
  // them), so only that each was measured is asserted.
  EXPECT_GT(measured->blocks[1].backward_s, 0);
  EXPECT_GT(measured->blocks[1].backward_first_s, 0);
  EXPECT_GT(measured->link_bandwidth, 0);
  auto reread = parse_profile(to_json_text(*measured), "profile", &error);
  ASSERT_TRUE(reread) << error;
  EXPECT_EQ(reread->blocks[2].forward_s, measured->blocks[2].forward_s);

  // Twice the measured times: half the samples per second.
  machine_profile profile = two_linear_blocks();
  simulation_options options;
  options.profile = profile;
  const double base = simulated(config, ideal_cluster(2), options).summary.samples_per_s;
  for (block_profile& block : options.profile->blocks) {
    block.forward_s *= 2;
    block.backward_s *= 2;
  }
  const double slower = simulated(config, ideal_cluster(2), options).summary.samples_per_s;
  EXPECT_NEAR(slower / base, 0.5, 0.02);
  // One key at a time: 32 samples per 2 × (1 + 2) ms.
  config.parallelism.max_active_keys = 1;
  options.profile = profile;
  EXPECT_NEAR(simulated(config, ideal_cluster(2), options).summary.samples_per_s, 32 / 6e-3,
              32 / 6e-3 * 0.02);

  // Evaluation keys are charged from the time measured at the evaluation batch, not from the
  // training forward scaled: stage 0's one evaluation key of 16 samples, at 4 ms per 256.
  EXPECT_EQ(measured->evaluation_batch, actors::evaluation_batch);
  EXPECT_GT(measured->blocks[1].evaluate_s, 0);
  EXPECT_EQ(reread->blocks[1].evaluate_s, measured->blocks[1].evaluate_s);
  auto evaluation_span_s = [&](const simulation_options& with) {
    const nlohmann::json timeline = simulated(config, ideal_cluster(2), with).trace->to_json();
    for (const auto& event : timeline["traceEvents"]) {
      if (event["ph"] == "X" && event["name"] == "evaluate" && event["tid"] == 1) {
        return event["dur"].get<double>() / 1e6;
      }
    }
    return -1.0;
  };
  EXPECT_NEAR(evaluation_span_s(options), 1e-3 * 16 / 32, 1e-9);
  options.profile->evaluation_batch = 256;
  options.profile->blocks[1].evaluate_s = 4e-3;
  EXPECT_NEAR(evaluation_span_s(options), 4e-3 * 16 / 256, 1e-9);

  profile.blocks.pop_back();
  options.profile = profile;
  auto data = actors::load_job_data(config, &error);
  quiet_observer observer;
  EXPECT_FALSE(simulate(config, *data, ideal_cluster(2), options, observer, &error));
  EXPECT_NE(error.find("the profile times 2 blocks but the job's model has 3"), std::string::npos)
      << error;
  EXPECT_FALSE(parse_profile("{\"threads\": 1}", "p.json", &error));
  EXPECT_NE(error.find("p.json: batch: missing"), std::string::npos) << error;
}

TEST(SimulationTest, TheCoordinatorAssemblesEachKeysBatchBeforeItLeaves) {
  actors::job_config config = balanced_job(2, 1, actors::pipeline_mode::async);
  config.data.synthetic_train = 640;
  std::string error;
  auto measured = calibrate(config, 0.01, &error);
  ASSERT_TRUE(measured) << error;
  EXPECT_GT(measured->coordinator_s_per_sample, 0);
  auto reread = parse_profile(to_json_text(*measured), "profile", &error);
  ASSERT_TRUE(reread) << error;
  EXPECT_EQ(reread->coordinator_s_per_sample, measured->coordinator_s_per_sample);

  // One key at a time of 32 samples through 6 ms of compute; at 0.1 ms per sample the
  // coordinator holds each key 3.2 ms more before it leaves.
  config.parallelism.max_active_keys = 1;
  simulation_options options;
  options.profile = two_linear_blocks();
  EXPECT_NEAR(simulated(config, ideal_cluster(2), options).summary.samples_per_s, 32 / 6e-3,
              32 / 6e-3 * 0.02);
  options.profile->coordinator_s_per_sample = 1e-4;
  EXPECT_NEAR(simulated(config, ideal_cluster(2), options).summary.samples_per_s, 32 / 9.2e-3,
              32 / 9.2e-3 * 0.02);
}

TEST(SimulationTest, CalibrationTimesThePredictedCopyOfTheJobsThatPredictWeights) {
  actors::job_config config = balanced_job(2, 1, actors::pipeline_mode::async);
  config.data.synthetic_train = 640;
  config.training.momentum = 0.9;  // the predicted copy moves along the momentum
  std::string error;
  auto plain = calibrate(config, 0.01, &error);
  ASSERT_TRUE(plain) << error;
  for (const block_profile& block : plain->blocks) EXPECT_EQ(block.predict_s, 0) << block.type;

  config.parallelism.staleness_correction = actors::staleness_correction_kind::predict;
  auto predicting = calibrate(config, 0.01, &error);
  ASSERT_TRUE(predicting) << error;
  // A copy of the weights, then a pass over it and the momentum: more than the copy alone.
  EXPECT_GT(predicting->blocks[1].predict_s, predicting->blocks[1].stash_s);
  auto reread = parse_profile(to_json_text(*predicting), "profile", &error);
  ASSERT_TRUE(reread) << error;
  EXPECT_EQ(reread->blocks[1].predict_s, predicting->blocks[1].predict_s);
}

TEST(SimulationTest, EveryMessageEndCostsTheStagesDeviceItsMeasuredCpuTime) {
  actors::job_config config = balanced_job(2, 1, actors::pipeline_mode::async);
  config.data.synthetic_train = 640;
  std::string error;
  auto measured = calibrate(config, 0.01, &error);
  ASSERT_TRUE(measured) << error;
  EXPECT_GT(measured->inproc_message_cpu_s, 0);
  EXPECT_GT(measured->ipc_message_cpu_s, 0);
  EXPECT_GE(measured->inproc_message_cpu_per_byte_s, 0);
  EXPECT_GE(measured->ipc_message_cpu_per_byte_s, 0);
  EXPECT_GT(measured->blocks[1].stash_s, 0);
  auto reread = parse_profile(to_json_text(*measured), "profile", &error);
  ASSERT_TRUE(reread) << error;
  EXPECT_EQ(reread->ipc_message_cpu_s, measured->ipc_message_cpu_s);
  EXPECT_EQ(reread->inproc_message_cpu_per_byte_s, measured->inproc_message_cpu_per_byte_s);
  EXPECT_EQ(reread->blocks[1].stash_s, measured->blocks[1].stash_s);

  // One key at a time through 2 stages of 1 ms forward and 2 ms backward: 6 ms of compute and
  // 7 message ends at the stages (stage 0 forward: in, out; stage 1 forward and backward: in,
  // loss report, gradient out; stage 0 backward: in, retired) and 2 at the coordinator on the
  // way from one key to the next (the retired report in, the next key out) of 0.5 ms each; it
  // takes the loss report in while stage 0 runs the backward.
  machine_profile profile = two_linear_blocks();
  config.parallelism.max_active_keys = 1;
  simulation_options options;
  options.profile = profile;
  options.message_cpu_s = 0.5e-3;
  EXPECT_NEAR(simulated(config, ideal_cluster(2), options).summary.samples_per_s, 32 / 10.5e-3,
              32 / 10.5e-3 * 0.02);
}

TEST(SimulationTest, MessagesCostCpuTimeByTheirPayload) {
  // One key at a time through 2 stages: 6 ms of compute (1 ms forward and 2 ms backward per
  // linear block; the layernorm is free); six ends of its messages carry 32 × 256 floats (the
  // coordinator's send, stage 0's input and output, stage 1's input, the gradient out and stage
  // 0's backward input), at 10 ns a byte: 1.97 ms more per key (labels add under 0.01 ms).
  actors::job_config config = balanced_job(2, 1, actors::pipeline_mode::async);
  config.parallelism.max_active_keys = 1;
  simulation_options options;
  options.profile = two_linear_blocks();
  options.message_cpu_per_byte_s = 1e-8;
  const double seconds_per_key = 6e-3 + 1e-8 * 6 * 32 * 256 * 4;
  EXPECT_NEAR(simulated(config, ideal_cluster(2), options).summary.samples_per_s,
              32 / seconds_per_key, 32 / seconds_per_key * 0.02);
}

}  // namespace
}  // namespace troupe::sim
