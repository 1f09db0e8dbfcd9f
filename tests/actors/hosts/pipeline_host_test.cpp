// The real host: stage actors and a coordinator actor exchanging ZeroMQ frames in one process
// train exactly like the sequential reference in sync mode, and keep async staleness bounded.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "actors/config/job_data.h"
#include "actors/engine/learning_rate.h"
#include "actors/engine/sequential_trainer.h"
#include "actors/hosts/actor_hosting.h"
#include "actors/hosts/pipeline_host.h"
#include "actors/hosts/pipeline_test_seam.h"
#include "layers/backend_registry.h"
#include "layers/gemm_precision.h"
#include "tests/support/engine_helpers.h"
#include "tests/support/job_helpers.h"

namespace troupe::actors {
namespace {

using actors::quiet_observer;
using testing::wall_clock;

using testing::max_relative_difference;
using testing::weights;

job_config host_job(int stages, int micro_batches, pipeline_mode mode, pipeline_schedule schedule) {
  job_config config = testing::small_pipeline_job(stages, micro_batches, mode, schedule, 800);
  config.training.weight_decay = 0;
  config.training.epochs = 1;
  config.parallelism.threads = stages;
  config.metrics.log_interval = 10;
  return config;
}

weights sequential_weights(const job_config& config, const layers::dataset& data) {
  return testing::sequential_weights(config, data, data.count() / config.training.batch_size);
}

pipeline_report run(const job_config& config, job_data* data_out = nullptr) {
  std::string error;
  auto data = load_job_data(config, &error);
  EXPECT_TRUE(data.has_value()) << error;
  wall_clock clock;
  quiet_observer observer;
  pipeline_options options;
  options.collect_weights = true;
  auto report = run_pipeline(config, *data, observer, clock, options, &error);
  EXPECT_TRUE(report.has_value()) << error;
  if (data_out) *data_out = *data;
  return *report;
}

/// The Chrome trace of a run of the 2-stage `config` (no events when the run failed).
nlohmann::json traced_run(const job_config& config) {
  std::string error;
  auto data = load_job_data(config, &error);
  EXPECT_TRUE(data) << error;
  if (!data) return {{"traceEvents", nlohmann::json::array()}};
  trace_recorder trace(2);
  pipeline_options options;
  options.trace = &trace;
  wall_clock clock;
  quiet_observer observer;
  EXPECT_TRUE(run_pipeline(config, *data, observer, clock, options, &error)) << error;
  return trace.to_json();
}

weights all_weights(const pipeline_report& report) {
  weights result;
  for (const auto& stage : report.stages) {
    for (const auto& w : stage.weights) result.push_back(w);
  }
  return result;
}

TEST(PipelineHostTest, SyncStagesOverZeroMqEqualSequential) {
  for (const auto& [stages, micro, schedule] : {std::tuple{2, 4, pipeline_schedule::gpipe},
                                                std::tuple{4, 4, pipeline_schedule::one_f_one_b},
                                                std::tuple{4, 2, pipeline_schedule::gpipe}}) {
    job_config config = host_job(stages, micro, pipeline_mode::sync, schedule);
    job_data data;
    pipeline_report report = run(config, &data);
    ASSERT_EQ(report.stages.size(), static_cast<size_t>(stages));
    EXPECT_LE(max_relative_difference(all_weights(report), sequential_weights(config, data.train)),
              1e-5)
        << to_string(schedule) << " S=" << stages << " M=" << micro;
    EXPECT_EQ(report.summary.steps, 50);
    EXPECT_EQ(report.dropped_frames, 0u);
    for (const auto& stage : report.stages) EXPECT_EQ(stage.version, 50);
  }
}

TEST(PipelineHostTest, SyncStagesAtBf16EqualSequentialAtBf16) {
  // Each stage sets its own stream to bf16. One micro-batch: the same GEMMs as the sequential
  // trainer, bit for bit; four: reassociated gradient sums, within 2u = 2^-7 (see
  // pipeline_test.cpp; this run measures 1.1e-3).
  for (const auto& [stages, micro, tolerance] : {std::tuple{2, 1, 0.0}, std::tuple{4, 4, 0x1p-7}}) {
    job_config config = host_job(stages, micro, pipeline_mode::sync, pipeline_schedule::gpipe);
    config.training.precision = layers::math_precision::bf16;
    job_data data;
    pipeline_report report = run(config, &data);
    const weights expected = sequential_weights(config, data.train);
    EXPECT_LE(max_relative_difference(all_weights(report), expected), tolerance)
        << "S=" << stages << " M=" << micro;
    config.training.precision = layers::math_precision::fp32;
    EXPECT_GT(max_relative_difference(all_weights(report), sequential_weights(config, data.train)),
              1e-4)
        << "the bf16 run must differ from fp32";
  }
}

TEST(PipelineHostTest, SyncStagesOnCudaEqualSequentialOnCuda) {
  // Every stage opens the GPU as a backend of its own and runs on a stream of its own; keys
  // cross over inproc ZeroMQ in pinned host buffers.
  if (layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (layers::math_precision precision :
       {layers::math_precision::fp32, layers::math_precision::bf16}) {
    job_config config = host_job(3, 2, pipeline_mode::sync, pipeline_schedule::one_f_one_b);
    config.parallelism.devices = {"cuda"};
    config.training.precision = precision;
    job_data data;
    pipeline_report report = run(config, &data);
    const double tolerance = precision == layers::math_precision::fp32 ? 1e-5 : 0x1p-7;
    EXPECT_LE(max_relative_difference(
                  all_weights(report),
                  testing::sequential_weights(
                      config, data.train, data.train.count() / config.training.batch_size, "cuda")),
              tolerance)
        << to_string(precision);
    EXPECT_EQ(report.dropped_frames, 0u);
  }
}

TEST(PipelineHostTest, AsyncWithOneActiveKeyEqualsSequential) {
  job_config config = host_job(3, 2, pipeline_mode::async, pipeline_schedule::gpipe);
  config.parallelism.max_active_keys = 1;
  job_data data;
  pipeline_report report = run(config, &data);
  EXPECT_LE(max_relative_difference(all_weights(report), sequential_weights(config, data.train)),
            1e-5);
}

TEST(PipelineHostTest, AsyncStalenessStaysWithinItsBoundAndTheRunEvaluates) {
  job_config config = host_job(4, 2, pipeline_mode::async, pipeline_schedule::gpipe);
  config.parallelism.max_active_keys = 6;
  config.parallelism.min_update_interval = 2;
  config.training.epochs = 2;
  pipeline_report report = run(config);
  for (const auto& stage : report.stages) {
    EXPECT_LE(stage.staleness_histogram.size(), 1u + (6 - 1 + 2 - 1) / 2);
    EXPECT_LE(stage.peak_contexts, 6u);
  }
  EXPECT_EQ(report.summary.epochs, 2);
  EXPECT_GT(report.summary.final_test_accuracy, 0.5);
}

// A message for a stage that is idle must start being handled at once, whatever the other
// stages are doing. With CAF's work stealing (without its polling, which preempts the stages'
// GEMM threads) a message from a non-actor thread lands in a busy thread's queue and waits
// until that handler ends or an idle thread wakes to steal it, every 10 ms: async stages take
// turns. How long a message waits is the machine's to say (`troupe bench pipeline` measures the
// async rate it costs; on a loaded machine the waits of both schedulers overlap); what the
// engine decides is the scheduler: one queue that all its threads share, each blocked until a
// message arrives.
TEST(PipelineHostTest, ActorSystemsShareOneSchedulerQueue) {
  for (const auto& [threads, expected] : {std::pair{3, size_t{3}}, std::pair{0, size_t{1}}}) {
    caf::actor_system_config settings;
    configure_scheduler(settings, threads);
    EXPECT_EQ(caf::get_or(settings, "scheduler.policy", caf::atom("stealing")),
              caf::atom("sharing"));
    EXPECT_EQ(caf::get_or(settings, "scheduler.max-threads", size_t{0}), expected) << threads;
  }
}

TEST(PipelineHostTest, EachStageKeepsOneThreadOfItsOwnWhenEveryStageHasACore) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one core: stages take turns";
  job_config config = host_job(2, 1, pipeline_mode::async, pipeline_schedule::gpipe);
  std::string error;
  auto data = load_job_data(config, &error);
  ASSERT_TRUE(data) << error;
  std::mutex lock;
  std::map<int, std::set<std::thread::id>> threads;  // per stage actor
  const stage_message_hook hook = [&](int actor, const message_note&) {
    const std::lock_guard<std::mutex> guard(lock);
    threads[actor].insert(std::this_thread::get_id());
  };
  wall_clock clock;
  quiet_observer observer;
  // Returning at all shows that the stages' threads ended with the run.
  ASSERT_TRUE(run_pipeline_with_hook(config, *data, observer, clock, {}, hook, &error)) << error;
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_EQ(threads[0].size(), 1u) << "stage 0 moved between threads";
  EXPECT_EQ(threads[1].size(), 1u) << "stage 1 moved between threads";
  EXPECT_NE(*threads[0].begin(), *threads[1].begin());
}

// The last stage's input gradient is on the critical path and its loss report is not: waking
// the coordinator first would let it take the sender's core before the gradient leaves.
TEST(PipelineHostTest, TheLastStageSendsItsGradientBeforeItsReportAndTheTraceShowsTheCoordinator) {
  job_config config = host_job(2, 1, pipeline_mode::sync, pipeline_schedule::gpipe);
  const nlohmann::json timeline = traced_run(config);
  const int64_t steps = config.data.synthetic_train / config.training.batch_size;
  std::map<uint64_t, const nlohmann::json*> starts;
  int admissions = 0;
  for (const auto& event : timeline["traceEvents"]) {
    if (event["ph"] == "s") starts[event["id"].get<uint64_t>()] = &event;
    if (event["ph"] == "X" && event["tid"] == 0 && event["name"] == "admit") ++admissions;
  }
  // Per key: when stage 1 sent its gradient (to stage 0) and its report (to the coordinator).
  std::map<int64_t, double> gradient_sent, report_sent;
  for (const auto& event : timeline["traceEvents"]) {
    if (event["ph"] != "f") continue;
    const nlohmann::json& start = *starts.at(event["id"].get<uint64_t>());
    if (start["tid"] != 2) continue;
    const int64_t key = start["args"]["key"].get<int64_t>();
    (event["tid"] == 1 ? gradient_sent : report_sent)[key] = start["ts"].get<double>();
  }
  // Each step but the first is admitted on a report (the epoch's evaluation on one more).
  EXPECT_GE(admissions, steps - 1);
  ASSERT_EQ(gradient_sent.size(), static_cast<size_t>(steps));
  for (const auto& [key, at] : gradient_sent) {
    ASSERT_TRUE(report_sent.count(key)) << key;
    EXPECT_LE(at, report_sent[key]) << "key " << key;
  }
}

TEST(PipelineHostTest, ADivergingRunStopsAndNamesTheStepAndTheLearningRate) {
  job_config config = host_job(3, 2, pipeline_mode::async, pipeline_schedule::gpipe);
  config.training.lr = 1e30;
  config.training.lr_schedule = lr_schedule_kind::constant;
  config.training.epochs = 3;
  std::string error;
  auto data = load_job_data(config, &error);
  ASSERT_TRUE(data.has_value()) << error;
  wall_clock clock;
  quiet_observer observer;
  auto report = run_pipeline(config, *data, observer, clock, pipeline_options(), &error);
  EXPECT_FALSE(report.has_value());
  EXPECT_NE(error.find("training diverged: the loss of step "), std::string::npos) << error;
  EXPECT_NE(error.find("(lr 1e+30)"), std::string::npos) << error;
  EXPECT_NE(error.find("training.lr"), std::string::npos) << error;

  config.training.lr = 0.05;  // the same job with a sane rate finishes
  report = run_pipeline(config, *data, observer, clock, pipeline_options(), &error);
  ASSERT_TRUE(report.has_value()) << error;
  EXPECT_EQ(report->summary.epochs, 3);
}

}  // namespace
}  // namespace troupe::actors
