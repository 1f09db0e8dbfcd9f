// Data-parallel replicas of the pipeline on the real host: in sync mode R replicas of an
// S-stage pipeline train like one pipeline at the same global batch, and stay equal; in async
// mode their averages of the weights keep pace with their steps.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "actors/config/job_data.h"
#include "actors/engine/trace_recorder.h"
#include "actors/hosts/pipeline_host.h"
#include "actors/hosts/replica_groups.h"
#include "layers/backend_registry.h"
#include "tests/support/engine_helpers.h"
#include "tests/support/job_helpers.h"

namespace troupe::actors {
namespace {

using testing::max_relative_difference;
using testing::weights;

job_config replica_job(int stages, int micro_batches, int replicas, pipeline_schedule schedule) {
  job_config config =
      testing::small_pipeline_job(stages, micro_batches, pipeline_mode::sync, schedule, 800);
  config.training.epochs = 1;
  config.parallelism.replicas = replicas;
  config.parallelism.threads = stages * replicas;
  config.metrics.log_interval = 10;
  return config;
}

pipeline_report run(const job_config& config, trace_recorder* trace = nullptr) {
  std::string error;
  auto data = load_job_data(config, &error);
  EXPECT_TRUE(data.has_value()) << error;
  testing::wall_clock clock;
  quiet_observer observer;
  pipeline_options options;
  options.collect_weights = true;
  options.trace = trace;
  auto report = run_pipeline(config, *data, observer, clock, options, &error);
  EXPECT_TRUE(report.has_value()) << error;
  return report ? *report : pipeline_report{};
}

/// The weights of replica `replica`'s stages, in stage order.
weights replica_weights(const pipeline_report& report, int stages, int replica) {
  weights result;
  for (int s = 0; s < stages; ++s) {
    for (const auto& w : report.stages[static_cast<size_t>(replica * stages + s)].weights) {
      result.push_back(w);
    }
  }
  return result;
}

/// How many of `trace`'s spans are ring chunks ("reduce…").
int64_t ring_chunk_spans(const trace_recorder& trace) {
  int64_t chunks = 0;
  const nlohmann::json records = trace.records();  // the loop below must not outlive it
  for (const auto& span : records["spans"]) {
    if (span[1].get<std::string>().rfind("reduce", 0) == 0) ++chunks;
  }
  return chunks;
}

/// Sync replicas that sum by `collective` against one pipeline at the same global batch.
void expect_replicas_train_like_one_pipeline(collective_kind collective) {
  // stages, micro-batches per replica, replicas, schedule, clip_norm (global clipping)
  for (const auto& [stages, micro, replicas, schedule, clip] :
       {std::tuple{2, 2, 2, pipeline_schedule::gpipe, 0.0},
        std::tuple{2, 2, 2, pipeline_schedule::one_f_one_b, 0.0},
        std::tuple{2, 1, 2, pipeline_schedule::gpipe, 0.5},
        std::tuple{1, 1, 4, pipeline_schedule::gpipe, 0.0},
        std::tuple{2, 2, 2, pipeline_schedule::zb_h1, 0.0}}) {
    SCOPED_TRACE(std::string(to_string(schedule)) + " S=" + std::to_string(stages) +
                 " M=" + std::to_string(micro) + " R=" + std::to_string(replicas) +
                 " clip=" + std::to_string(clip) + " " + to_string(collective));
    job_config replicated = replica_job(stages, micro, replicas, schedule);
    replicated.training.clip_norm = clip;
    replicated.parallelism.collective = collective;
    job_config single = replica_job(stages, micro * replicas, 1, schedule);
    single.training.clip_norm = clip;
    trace_recorder trace(stages * replicas);
    const pipeline_report many = run(replicated, &trace);
    const pipeline_report one = run(single);
    ASSERT_EQ(many.stages.size(), static_cast<size_t>(stages * replicas));
    ASSERT_EQ(one.stages.size(), static_cast<size_t>(stages));
    // The ring's chunks travel as messages; a group's sums do not.
    if (collective == collective_kind::ring) {
      EXPECT_GT(ring_chunk_spans(trace), 0);
    } else {
      EXPECT_EQ(ring_chunk_spans(trace), 0);
    }
    EXPECT_LE(
        max_relative_difference(replica_weights(many, stages, 0), replica_weights(one, stages, 0)),
        1e-5);
    // Every replica took the same steps to the same bits.
    for (int r = 1; r < replicas; ++r) {
      EXPECT_EQ(replica_weights(many, stages, r), replica_weights(many, stages, 0)) << r;
    }
    for (const stage_report& stage : many.stages) EXPECT_EQ(stage.version, 50);
    EXPECT_EQ(many.summary.steps, 50);
    EXPECT_EQ(many.dropped_frames, 0u);
    EXPECT_NEAR(many.summary.final_test_accuracy, one.summary.final_test_accuracy, 0.011);
  }
}

TEST(ReplicaTest, SyncReplicasEqualOnePipelineAtTheSameGlobalBatch) {
  expect_replicas_train_like_one_pipeline(collective_kind::ring);
}

TEST(ReplicaTest, SharedMemoryGroupsSumLikeOnePipeline) {
  // The replica-group path of parallelism.collective (NCCL's on GPUs) with CPU ranks.
  expect_replicas_train_like_one_pipeline(collective_kind::shared_memory);
}

TEST(ReplicaTest, SharedMemoryGroupsAverageAsyncReplicasAtEveryInterval) {
  // Async replicas averaging through the group every second step: the run ends on an average
  // (100 steps), so every replica holds the same weights, bit for bit.
  job_config config = replica_job(2, 1, 2, pipeline_schedule::gpipe);
  config.parallelism.mode = pipeline_mode::async;
  config.parallelism.max_active_keys = 2;
  config.parallelism.min_update_interval = 1;
  config.parallelism.replica_sync_interval = 2;
  config.parallelism.replica_staleness = 2;
  config.parallelism.collective = collective_kind::shared_memory;
  config.training.batch_size = 8;
  trace_recorder trace(4);
  const pipeline_report report = run(config, &trace);
  ASSERT_EQ(report.stages.size(), 4u);
  EXPECT_EQ(ring_chunk_spans(trace), 0);
  for (const stage_report& stage : report.stages) EXPECT_EQ(stage.version, 100);
  EXPECT_EQ(replica_weights(report, 2, 1), replica_weights(report, 2, 0));
  EXPECT_GT(report.summary.final_test_accuracy, 0.5);
}

TEST(ReplicaTest, ReplicaGroupsThatCannotFormAreNamedBeforeTheRun) {
  job_config config = replica_job(2, 1, 2, pipeline_schedule::gpipe);
  EXPECT_EQ(replica_group_problem(config, true), "");  // the ring
  config.parallelism.collective = collective_kind::shared_memory;
  EXPECT_EQ(replica_group_problem(config, true), "");
  EXPECT_NE(replica_group_problem(config, false).find("sums the replicas in one process"),
            std::string::npos);
  config.parallelism.collective = collective_kind::nccl;
  config.parallelism.devices = {"cuda"};
  if (!layers::nccl_compiled()) {
    EXPECT_NE(replica_group_problem(config, true).find("has no NCCL"), std::string::npos);
    return;
  }
  EXPECT_EQ(replica_group_problem(config, false), "");  // NCCL judges workers' GPUs itself
  EXPECT_NE(replica_group_problem(config, true)
                .find("replicas 0 and 1 of stage 0 would both run on cuda:0"),
            std::string::npos)
      << replica_group_problem(config, true);
  config.parallelism.devices = {"cuda:0", "cuda:1", "cuda:1", "cuda:0"};
  EXPECT_EQ(replica_group_problem(config, true), "");
}

TEST(ReplicaTest, NcclGroupsOnTwoGpusSumLikeOnePipeline) {
  if (!layers::nccl_compiled() || layers::cuda_device_count() < 2) {
    GTEST_SKIP() << "needs NCCL and 2 GPUs (NCCL refuses two ranks on one GPU)";
  }
  job_config grouped = replica_job(2, 2, 2, pipeline_schedule::one_f_one_b);
  grouped.parallelism.collective = collective_kind::nccl;
  grouped.parallelism.devices = {"cuda:0", "cuda:0", "cuda:1", "cuda:1"};
  job_config single = replica_job(2, 4, 1, pipeline_schedule::one_f_one_b);
  single.parallelism.devices = {"cuda:0"};
  trace_recorder trace(4);
  const pipeline_report many = run(grouped, &trace);
  const pipeline_report one = run(single);
  ASSERT_EQ(many.stages.size(), 4u);
  EXPECT_EQ(ring_chunk_spans(trace), 0);
  EXPECT_LE(max_relative_difference(replica_weights(many, 2, 0), replica_weights(one, 2, 0)), 1e-4);
  EXPECT_EQ(replica_weights(many, 2, 1), replica_weights(many, 2, 0));
}

TEST(ReplicaTest, AsyncAveragesKeepPaceWithTheSteps) {
  // Two replicas of one stage in one process, averaging their weights every step and kept
  // within a version of each other: each round of the ring brings a stage 2 chunks (one
  // reduce-scatter, one all-gather step), and the coordinator's next key reaches the stage's
  // inbox as soon as the last one is reported.
  job_config config = testing::small_pipeline_job(1, 1, pipeline_mode::async,
                                                  pipeline_schedule::gpipe, 16 * 2 * 120);
  config.model.input_shape = {256};
  config.model.layers = {testing::block("linear", 512), testing::block("relu"),
                         testing::block("linear", 512), testing::block("relu"),
                         testing::block("linear", 4)};
  config.training.epochs = 1;
  config.training.batch_size = 32;
  config.parallelism.replicas = 2;
  config.parallelism.threads = 2;
  config.parallelism.max_active_keys = 1;
  config.parallelism.min_update_interval = 1;
  config.parallelism.replica_sync_interval = 1;
  config.parallelism.replica_staleness = 1;
  trace_recorder trace(2);
  run(config, &trace);
  ASSERT_FALSE(::testing::Test::HasFailure());  // the run failed
  // The replicas' steps and ring chunks in the order they took them: the averages each
  // replica finished trail the slower replica's steps by few (the faster may run ahead; its
  // averages wait for the slower one).
  const nlohmann::json records = trace.records();
  std::vector<std::tuple<double, int, std::string>> spans;
  for (const auto& span : records["spans"]) {
    const int track = span[0].get<int>();
    if (track >= 0) spans.emplace_back(span[3].get<double>(), track, span[1].get<std::string>());
  }
  std::sort(spans.begin(), spans.end());
  int64_t steps[2] = {0, 0}, chunks[2] = {0, 0}, most_behind = 0;
  for (const auto& [start_s, actor, name] : spans) {
    if (name.rfind("reduce", 0) == 0) ++chunks[actor];
    if (name != "forward+backward+step") continue;
    ++steps[actor];
    for (int r = 0; r < 2; ++r) {
      most_behind = std::max(most_behind, std::min(steps[0], steps[1]) - chunks[r] / 2);
    }
  }
  EXPECT_EQ(steps[0], 120);
  EXPECT_EQ(steps[1], 120);
  EXPECT_EQ(chunks[0], 2 * 120);
  EXPECT_EQ(chunks[1], 2 * 120);
  // Taken in turns with the keys, the averages trailed by 28-42 steps at the end.
  EXPECT_LE(most_behind, 8);
}

}  // namespace
}  // namespace troupe::actors
