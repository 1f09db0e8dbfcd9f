// Dynamic models through the stage state machines: a sync pipeline of a graph's nodes equals
// the graph oracle (every instance run alone), and async keys of different sizes overtake each
// other within the staleness bound.

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/graph_oracle.h"
#include "layers/backend_registry.h"
#include "layers/listops.h"
#include "layers/random.h"
#include "tests/support/job_helpers.h"
#include "tests/support/local_pipeline.h"

namespace troupe::actors {
namespace {

using testing::block;
using testing::max_relative_difference;

/// embed → cell (a loop over each sequence, or a join over each tree) → head.
job_config graph_job(bool trees, int stages, int micro_batches, pipeline_mode mode) {
  job_config config;
  layers::layer_spec embedding = block("embedding");
  embedding.vocab = 16;
  embedding.dim = 6;
  config.model.nodes = {
      testing::graph_node("embed", {embedding}, node_route::chain, node_emit::every, "cell"),
      testing::graph_node("cell", {block("linear", 8), block("tanh")},
                          trees ? node_route::tree : node_route::loop,
                          trees ? node_emit::root : node_emit::every, "head"),
      testing::graph_node("head", {block("linear", trees ? 10 : 16)}, node_route::chain,
                          node_emit::every, "")};
  config.data.dataset = trees ? dataset_kind::listops : dataset_kind::text_records;
  config.training.batch_size = 8;
  config.training.lr = 0.1;
  config.training.seed = 5;
  config.parallelism.stages = stages;
  config.parallelism.micro_batches = micro_batches;
  config.parallelism.mode = mode;
  config.parallelism.partition = "uniform";
  return config;
}

/// A GPT over whole sequences: embed (positions counted in each sequence) and a block, a block,
/// then layernorm and lm_head; attention within each sequence, nothing padded.
job_config gpt_job(int stages, int micro_batches) {
  job_config config = graph_job(false, stages, micro_batches, pipeline_mode::sync);
  layers::layer_spec embedding = block("embedding");
  embedding.vocab = 16;
  embedding.dim = 8;
  embedding.positions = 10;
  layers::layer_spec transformer = block("transformer_block");
  transformer.heads = 2;
  layers::layer_spec head = block("lm_head");
  head.vocab = 16;
  config.model.nodes = {
      testing::graph_node("embed", {embedding, transformer}, node_route::chain, node_emit::every,
                          "middle"),
      testing::graph_node("middle", {transformer}, node_route::chain, node_emit::every, "top"),
      testing::graph_node("top", {block("layernorm"), head}, node_route::chain, node_emit::every,
                          "")};
  return config;
}

/// ListOps trees, or sequences of 1 to 9 tokens each labelled with the next.
layers::dataset instances(bool trees) {
  auto data = std::make_shared<layers::instance_dataset>();
  if (trees) {
    layers::listops_options options;
    options.train_count = 64;
    options.test_count = 1;
    options.max_depth = 3;
    std::string error;
    auto splits = layers::generate_listops(options, &error);
    EXPECT_TRUE(splits.has_value()) << error;
    *data = std::move(splits->train);
  } else {
    layers::random_generator random(9);
    data->vocabulary = data->classes = 16;
    for (int i = 0; i < 64; ++i) {
      layers::instance& item = data->instances.emplace_back();
      const int length = 1 + static_cast<int>(random.below(9));
      for (int t = 0; t <= length; ++t)
        item.tokens.push_back(static_cast<int32_t>(random.below(16)));
      item.labels.assign(item.tokens.begin() + 1, item.tokens.end());
      item.tokens.pop_back();
    }
  }
  layers::dataset result;
  result.sample_shape = {1};
  result.instances = std::move(data);
  return result;
}

testing::weights oracle_weights(const job_config& config, const layers::dataset& data,
                                int64_t steps) {
  std::string error;
  auto device = layers::create_backend("cpu", 1, &error);
  graph_oracle oracle(config, *device);
  oracle.train(data, steps);
  testing::weights result;
  for (layers::parameter* p : oracle.parameters())
    result.push_back(p->value.to_host(oracle.work_stream()));
  return result;
}

void expect_pipeline_matches_oracle(const job_config& config, uint64_t order_seed) {
  const bool trees = config.data.dataset == dataset_kind::listops;
  const int stages = config.parallelism.stages;
  const int micro_batches = config.parallelism.micro_batches;
  const layers::dataset data = instances(trees);
  const int64_t steps = 12;
  std::string error;
  auto device = layers::create_backend("cpu", 1, &error);
  local_pipeline pipeline(config, *device, data.count(), steps, order_seed);
  pipeline.train(data, steps);
  const double difference =
      max_relative_difference(pipeline.weights(), oracle_weights(config, data, steps));
  EXPECT_LE(difference, 1e-5) << config.model.nodes[1].name << " S=" << stages
                              << " M=" << micro_batches << " order " << order_seed;
  for (int s = 0; s < pipeline.stage_count(); ++s) EXPECT_EQ(pipeline.stage(s).version(), steps);
}

void expect_pipeline_matches_oracle(bool trees, int stages, int micro_batches, pipeline_mode mode,
                                    uint64_t order_seed) {
  expect_pipeline_matches_oracle(graph_job(trees, stages, micro_batches, mode), order_seed);
}

TEST(GraphPipelineTest, SyncLoopPipelinesEqualTheOracle) {
  for (int stages : {1, 2, 3})
    for (int micro_batches : {1, 4})
      expect_pipeline_matches_oracle(false, stages, micro_batches, pipeline_mode::sync, 0);
}

TEST(GraphPipelineTest, SyncTreePipelinesEqualTheOracle) {
  for (int stages : {1, 2, 3})
    for (int micro_batches : {1, 2})
      expect_pipeline_matches_oracle(true, stages, micro_batches, pipeline_mode::sync, 0);
}

TEST(GraphPipelineTest, SyncEqualsTheOracleUnderShuffledDelivery) {
  for (uint64_t seed : {1, 2, 3}) {
    expect_pipeline_matches_oracle(true, 3, 2, pipeline_mode::sync, seed);
    expect_pipeline_matches_oracle(false, 3, 4, pipeline_mode::sync, seed);
  }
}

TEST(GraphPipelineTest, SyncGptOverWholeSequencesEqualsTheOracle) {
  for (int stages : {1, 2, 3})
    for (int micro_batches : {1, 4})
      expect_pipeline_matches_oracle(gpt_job(stages, micro_batches), 0);
  expect_pipeline_matches_oracle(gpt_job(3, 4), 2);
}

TEST(GraphPipelineTest, AsyncKeysOfTheirOwnSizesStayWithinTheStalenessBound) {
  job_config config = graph_job(false, 3, 1, pipeline_mode::async);
  config.training.batch_size = 2;
  config.parallelism.max_active_keys = 4;
  config.parallelism.min_update_interval = 1;
  const layers::dataset data = instances(false);
  std::string error;
  auto device = layers::create_backend("cpu", 1, &error);
  local_pipeline pipeline(config, *device, data.count(), 24, 3);
  pipeline.train(data, 24);
  for (int s = 0; s < pipeline.stage_count(); ++s) {
    const std::vector<int64_t>& histogram = pipeline.stage(s).staleness_histogram();
    // ceil((MAK − 1) / MUI) = 3 at most, and keys really were stale at the first stage.
    EXPECT_LE(histogram.size(), 4u) << "stage " << s;
    if (s == 0) EXPECT_GT(histogram.size(), 1u);
  }
}

}  // namespace
}  // namespace troupe::actors
