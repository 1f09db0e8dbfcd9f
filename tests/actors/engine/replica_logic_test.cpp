// Replicas of the pipeline in the engine's state machines, driven one message at a time in
// many orders: admission per replica, sync replicas equal to one pipeline, and async replicas
// held within replica_staleness versions of each other at every stage.

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "actors/config/job_data.h"
#include "actors/engine/admission.h"
#include "layers/backend_registry.h"
#include "tests/support/job_helpers.h"
#include "tests/support/local_pipeline.h"

namespace troupe::actors {
namespace {

using testing::max_relative_difference;

job_config replica_job(int stages, int micro_batches, int replicas, pipeline_mode mode) {
  job_config config =
      testing::small_pipeline_job(stages, micro_batches, mode, pipeline_schedule::gpipe, 640);
  config.parallelism.replicas = replicas;
  return config;
}

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

TEST(ReplicaAdmissionTest, SyncReplicasSplitEachBatchInTheSequentialOrder) {
  job_config config =
      replica_job(2, 2, 2, pipeline_mode::sync);  // batch 16: 4 keys of 4 samples a step
  admission_policy logic(admission_settings::of(config, 3));
  std::vector<admission> first = logic.admit();
  ASSERT_EQ(first.size(), 4u);
  std::set<int64_t> offsets;
  for (const admission& entry : first) {
    EXPECT_EQ(entry.step, 0);
    EXPECT_EQ(entry.replica, static_cast<int>(entry.key / 2));
    EXPECT_EQ(entry.micro_batch, static_cast<int>(entry.key % 2));
    EXPECT_EQ(entry.sample_offset, static_cast<int64_t>(entry.key) * 4);
    offsets.insert(entry.sample_offset);
  }
  EXPECT_EQ(offsets, (std::set<int64_t>{0, 4, 8, 12}));
  // The next step waits for every key of this one, in both replicas.
  for (uint64_t key : {0, 1, 2}) {
    EXPECT_TRUE(logic.retired(key));
    EXPECT_TRUE(logic.admit().empty());
  }
  EXPECT_TRUE(logic.retired(3));
  std::vector<admission> second = logic.admit();
  ASSERT_EQ(second.size(), 4u);
  EXPECT_EQ(second.front().step, 1);
  EXPECT_EQ(second.front().key, 4u);
}

TEST(ReplicaAdmissionTest, AsyncReplicaWaitsAtTheStalenessBound) {
  job_config config = replica_job(2, 1, 2, pipeline_mode::async);
  config.parallelism.max_active_keys = 4;
  config.parallelism.min_update_interval = 1;
  config.parallelism.replica_staleness = 2;
  admission_policy logic(admission_settings::of(config, 40));
  // Each replica may bring its stages to version 2 while the slowest is at 0.
  std::vector<admission> first = logic.admit();
  ASSERT_EQ(first.size(), 4u);
  EXPECT_EQ(logic.active(), 4);
  // Replica 0 retires both its keys: it may go two more versions ahead of replica 1 (still at
  // 0): nothing, as replica 1's version 0 allows replica 0 versions up to 2 only.
  for (const admission& entry : first) {
    if (entry.replica == 0) {
      EXPECT_TRUE(logic.retired(entry.key));
    }
  }
  EXPECT_TRUE(logic.admit().empty());
  for (const admission& entry : first) {
    if (entry.replica == 1) {
      EXPECT_TRUE(logic.retired(entry.key));
    }
  }
  EXPECT_EQ(logic.slowest_version(), 2);
  EXPECT_EQ(logic.admit().size(), 4u);
}

TEST(ReplicaPipelineTest, SyncReplicasEqualOnePipelineInAnyOrder) {
  const int64_t steps = 12;
  for (uint64_t seed : {0u, 1u, 7u, 31u}) {
    job_config replicated = replica_job(2, 2, 2, pipeline_mode::sync);
    job_config single = replica_job(2, 4, 1, pipeline_mode::sync);
    const layers::dataset data = training_set(single);
    auto device = cpu();
    local_pipeline many(replicated, *device, data.count(), steps, seed);
    local_pipeline one(single, *device, data.count(), steps, seed);
    many.train(data, steps);
    one.train(data, steps);
    std::vector<std::vector<float>> first_replica = many.weights();
    const size_t half = first_replica.size() / 2;
    std::vector<std::vector<float>> second_replica(first_replica.begin() + half,
                                                   first_replica.end());
    first_replica.resize(half);
    EXPECT_LE(max_relative_difference(first_replica, one.weights()), 1e-5) << "seed " << seed;
    EXPECT_EQ(first_replica, second_replica) << "seed " << seed;
    for (int actor = 0; actor < 4; ++actor) EXPECT_EQ(many.stage(actor).reductions(), steps);
  }
}

/// Largest version gap between the replicas of any stage after each delivery, over a run.
int64_t widest_replica_gap(job_config config, uint64_t seed, local_pipeline** out = nullptr) {
  const int64_t steps = 24;
  const layers::dataset data = training_set(config);
  auto device = cpu();
  local_pipeline pipeline(config, *device, data.count(), steps, seed);
  const int stages = config.parallelism.stages, replicas = config.parallelism.replicas;
  int64_t widest = 0;
  pipeline.after_delivery = [&] {
    for (int s = 0; s < stages; ++s) {
      int64_t low = INT64_MAX, high = 0;
      for (int r = 0; r < replicas; ++r) {
        low = std::min(low, pipeline.stage(r * stages + s).version());
        high = std::max(high, pipeline.stage(r * stages + s).version());
      }
      widest = std::max(widest, high - low);
    }
  };
  pipeline.train(data, steps);
  for (int actor = 0; actor < stages * replicas; ++actor) {
    // Every stage took every step, and averaged with its replicas every step.
    EXPECT_EQ(pipeline.stage(actor).version(), steps * config.parallelism.micro_batches);
    EXPECT_GE(pipeline.stage(actor).reductions(), 1);
    EXPECT_FALSE(pipeline.stage(actor).settling());
    const auto& histogram = pipeline.stage(actor).replica_staleness_histogram();
    if (config.parallelism.replica_staleness >= 0) {
      EXPECT_LE(histogram.size(), static_cast<size_t>(config.parallelism.replica_staleness) + 1);
    }
  }
  (void)out;
  return widest;
}

TEST(ReplicaPipelineTest, AsyncReplicasStayWithinTheStalenessBound) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    job_config config = replica_job(3, 1, 3, pipeline_mode::async);
    config.parallelism.max_active_keys = 4;
    config.parallelism.min_update_interval = 1;
    config.parallelism.replica_staleness = 1;
    EXPECT_LE(widest_replica_gap(config, seed), 1) << "seed " << seed;
  }
}

TEST(ReplicaPipelineTest, WithoutTheBoundAsyncReplicasDrift) {
  // The control: unbounded, some interleaving lets a replica run further ahead, or the test
  // above could not fail.
  int64_t widest = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    job_config config = replica_job(3, 1, 3, pipeline_mode::async);
    config.parallelism.max_active_keys = 4;
    config.parallelism.min_update_interval = 1;
    config.parallelism.replica_staleness = -1;
    widest = std::max(widest, widest_replica_gap(config, seed));
  }
  EXPECT_GT(widest, 1);
}

}  // namespace
}  // namespace troupe::actors
