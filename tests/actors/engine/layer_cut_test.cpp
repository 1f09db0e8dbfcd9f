// Partitions that cut inside a linear layer: the cut points as a job file spells them, the
// expanded model the engine runs, sync pipelines that still equal the sequential trainer of the
// uncut model, and the partitioner that cuts where whole blocks cannot balance the stages.

#include <gtest/gtest.h>

#include <algorithm>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/config/layer_cuts.h"
#include "actors/engine/layer_cut_search.h"
#include "actors/engine/partition.h"
#include "layers/backend_registry.h"
#include "tests/support/job_helpers.h"
#include "tests/support/local_pipeline.h"

namespace troupe::actors {
namespace {

using testing::block;
using testing::weights;

/// The small job's blocks as a job file writes them (see testing::small_pipeline_job).
const char* small_job_toml = R"(
[model]
input_shape = [12]
layers = [{ type = "linear", out = 24 }, { type = "tanh" }, { type = "dropout", p = 0.2 },
          { type = "linear", out = 20 }, { type = "relu" }, { type = "linear", out = 16 },
          { type = "gelu" }, { type = "linear", out = 4 }]
[data]
dataset = "synthetic"
classes = 4
[parallelism]
stages = 3
partition = ["3:8", 5]
)";

std::optional<job_config> parse(const std::vector<std::string>& overrides, std::string* error) {
  job_error problem;
  auto config = parse_job(small_job_toml, "job.toml", overrides, &problem);
  *error = problem.message;
  return config;
}

TEST(LayerCutTest, CutPointsInsideALayerExpandItAndWriteBackAsTheFileSpellsThem) {
  std::string error;
  auto config = parse({}, &error);
  ASSERT_TRUE(config) << error;
  const auto& blocks = config->model.layers;
  ASSERT_EQ(blocks.size(), 9u);
  EXPECT_EQ(blocks[3].type, "linear_head");
  EXPECT_EQ(blocks[4].type, "linear_tail");
  for (size_t i : {3, 4}) {
    EXPECT_EQ(blocks[i].out, 20);
    EXPECT_EQ(blocks[i].split, 8);
    EXPECT_EQ(blocks[i].origin, 3);
  }
  EXPECT_EQ(blocks[6].type, "linear");
  EXPECT_EQ(blocks[6].origin, 5) << "blocks behind the cut keep their written index";
  EXPECT_EQ(config->parallelism.partition, "4,6");
  auto ranges = partition_model(*config, &error);
  ASSERT_TRUE(ranges) << error;
  ASSERT_EQ(ranges->size(), 3u);
  EXPECT_EQ((*ranges)[1].first, 4u);
  EXPECT_EQ((*ranges)[2].first, 6u);

  const nlohmann::json json = to_json(*config);
  EXPECT_EQ(json["parallelism"]["partition"], nlohmann::json::parse(R"(["3:8", 5])"));
  ASSERT_EQ(json["model"]["layers"].size(), 8u);
  EXPECT_EQ(json["model"]["layers"][3], nlohmann::json::parse(R"({"type":"linear","out":20,
                                                                  "bias":true})"));
  // The same cut points as a string, as `--set` writes them, make the same job.
  auto again = parse({"parallelism.partition=\"3:8,5\""}, &error);
  ASSERT_TRUE(again) << error;
  EXPECT_EQ(config_hash(*again), config_hash(*config));
  auto cut_first = parse({"parallelism.partition=[\"0:12\", \"3:8\"]"}, &error);
  ASSERT_TRUE(cut_first) << error;
  EXPECT_EQ(cut_first->parallelism.partition, "1,5");
  EXPECT_EQ(to_json(*cut_first)["parallelism"]["partition"],
            nlohmann::json::parse(R"(["0:12", "3:8"])"));
}

TEST(LayerCutTest, ACutThatCannotBeIsOneLineNamingTheBlock) {
  struct bad_cut {
    const char* partition;
    const char* message;
  };
  for (const bad_cut& bad :
       {bad_cut{"[\"2:4\", 5]", "cuts inside model.layers[2] (dropout): only a linear layer's"},
        bad_cut{"[\"3:20\", 5]",
                "cuts model.layers[3] (linear) at output 20, which has outputs 0 "
                "to 19: cut at 1 to 19"},
        bad_cut{"[\"3:8\", \"3:12\"]", "cuts inside model.layers[3] (linear) twice"},
        bad_cut{"[\"3:0\", 5]", "must be a block index such as 3, or \"3:512\""},
        bad_cut{"[\"3:8\"]", "makes 2 stages but parallelism.stages is 3"},
        bad_cut{"[\"3:8\", 3]", "must be increasing cut points"},
        bad_cut{"[\"9:8\", 3]", "must be increasing cut points in [1, 7]"}}) {
    std::string error;
    EXPECT_FALSE(parse({std::string("parallelism.partition=") + bad.partition}, &error))
        << bad.partition;
    EXPECT_NE(error.find(bad.message), std::string::npos) << bad.partition << ": " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

/// `config`'s weights (expanded, in stage and layer order) with each cut layer's head and tail
/// joined again: the weights of the uncut model, as the sequential trainer holds them.
weights joined(const job_config& config, const weights& parts) {
  weights result;
  size_t next = 0;
  const auto& blocks = config.model.layers;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const layers::layer_spec& spec = blocks[i];
    const std::string type = layers::uncut_type(spec.type);
    if ((type != "linear" && type != "conv2d") || layers::is_cut_tail(spec.type)) continue;
    const size_t tensors = spec.bias ? 2 : 1;
    for (size_t t = 0; t < tensors; ++t) {
      std::vector<float> values = parts.at(next + t);
      if (layers::is_cut_head(spec.type)) {
        const std::vector<float>& tail = parts.at(next + tensors + t);
        values.insert(values.end(), tail.begin(), tail.end());
      }
      result.push_back(std::move(values));
    }
    next += layers::is_cut_head(spec.type) ? 2 * tensors : tensors;
  }
  EXPECT_EQ(next, parts.size());
  return result;
}

/// `whole` with its partition set to `cuts` trains `steps` steps in a sync pipeline to the
/// weights the sequential trainer reaches with the uncut model. The input gradient of a cut
/// layer sums its outputs in two parts: float reassociation.
void expect_cut_pipeline_equals_sequential(const job_config& whole, const std::string& cuts,
                                           int64_t steps) {
  job_config cut = whole;
  cut.parallelism.partition = cuts;
  ASSERT_EQ(expand_cut_points(&cut), "") << cuts;
  std::string error;
  auto data = load_job_data(whole, &error);
  ASSERT_TRUE(data) << error;
  auto device = layers::create_backend("cpu", 1, &error);
  local_pipeline pipeline(cut, *device, data->train.count(), steps, 0);
  pipeline.train(data->train, steps);
  const weights actual = joined(cut, pipeline.weights());
  const weights expected = testing::sequential_weights(whole, data->train, steps);
  ASSERT_EQ(actual.size(), expected.size()) << cuts;
  EXPECT_LE(testing::max_relative_difference(actual, expected), 1e-5)
      << to_string(whole.parallelism.schedule) << " " << cuts;
}

TEST(LayerCutTest, SyncPipelinesThatCutInsideLayersEqualTheSequentialTrainer) {
  struct run {
    pipeline_schedule schedule;
    int micro_batches;
    const char* cuts;
  };
  for (const run& r : {run{pipeline_schedule::gpipe, 4, "3:8,5"},
                       run{pipeline_schedule::one_f_one_b, 2, "0:12,3:8"},
                       run{pipeline_schedule::zb_h1, 4, "3:16,5:4"}}) {
    expect_cut_pipeline_equals_sequential(
        testing::small_pipeline_job(3, r.micro_batches, pipeline_mode::sync, r.schedule, 640),
        r.cuts, 40);
  }
}

/// A small CNN: two convolutions that keep the image's size, one that halves it, a linear head.
job_config small_cnn(int stages, pipeline_schedule schedule, int micro_batches) {
  job_config config =
      testing::small_pipeline_job(stages, micro_batches, pipeline_mode::sync, schedule, 320);
  config.model.input_shape = {2, 6, 6};
  layers::layer_spec same = block("conv2d", 6);
  same.kernel = 3;
  same.padding = 1;
  layers::layer_spec halving = block("conv2d", 4);
  halving.kernel = 2;
  halving.stride = 2;
  config.model.layers = {
      same, block("relu"), same, block("tanh"), halving, block("flatten"), block("linear", 4)};
  return config;
}

TEST(LayerCutTest, SyncPipelinesThatCutInsideConvolutionsEqualTheSequentialTrainer) {
  struct run {
    pipeline_schedule schedule;
    int micro_batches;
    const char* cuts;
  };
  for (const run& r :
       {run{pipeline_schedule::gpipe, 4, "0:2,2:5"}, run{pipeline_schedule::zb_h1, 2, "2:3,4"}}) {
    expect_cut_pipeline_equals_sequential(small_cnn(3, r.schedule, r.micro_batches), r.cuts, 30);
  }
  // A convolution that changes the image's size cannot stack its input and output channels.
  job_config strided = small_cnn(2, pipeline_schedule::gpipe, 1);
  strided.parallelism.partition = "4:2";
  EXPECT_NE(expand_cut_points(&strided).find("cuts inside model.layers[4] (conv2d): only a "
                                             "convolution that keeps its image's size"),
            std::string::npos);
}

TEST(LayerCutTest, TheFashionMlpIsBalancedByCutsInsideItsLayers) {
  for (int stages : {2, 3, 4}) {
    std::string error;
    job_config config = testing::fashion_mlp_job(stages, "balanced");
    auto costs = estimated_block_costs(config, &error);
    ASSERT_TRUE(costs) << error;
    auto whole = plan_partition(config, &*costs, &error);
    ASSERT_TRUE(whole) << error;
    const std::string cuts = cheapest_cut_points(config, *costs);
    job_config cut = config;
    cut.parallelism.partition = cuts;
    ASSERT_EQ(expand_cut_points(&cut), "") << cuts;
    auto cut_costs = estimated_block_costs(cut, &error);
    ASSERT_TRUE(cut_costs) << error;
    auto plan = plan_partition(cut, &*cut_costs, &error);
    ASSERT_TRUE(plan) << error;
    EXPECT_LE(largest_share(*plan), largest_share(*whole)) << stages << ": " << cuts;
    // Near an even split: the cuts fall on multiples of 16 outputs, and each adds its copies.
    EXPECT_LE(largest_share(*plan), 1.0 / stages + 0.02) << describe_plan(cut, *plan);
    if (stages != 2) continue;
    // Whole blocks: one stage holds two of the three large layers, about 60 %.
    EXPECT_GT(largest_share(*whole), 0.58);
    EXPECT_NE(cuts.find(':'), std::string::npos) << cuts;
    EXPECT_LE(largest_share(*plan), 0.52) << describe_plan(cut, *plan);
    EXPECT_EQ(describe_plan(cut, *plan).rfind("stages [0," + cuts + ") [" + cuts + ",11)", 0), 0u)
        << describe_plan(cut, *plan);
  }
}

}  // namespace
}  // namespace troupe::actors
