// `[[model.nodes]]`, a model that is a graph of nodes, and the data keys of dynamic models:
// read, checked with one line naming the key, written to config.json, and left out of it where
// a job does not use them (so that every chain job's config.json and hashes stay as they were).

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "actors/config/job_file.h"
#include "actors/config/job_warnings.h"
#include "tests/actors/config/job_file_test_support.h"

namespace troupe::actors {
namespace {

using ::testing::HasSubstr;
using namespace job_file_testing;

/// The tree job with `keys` added to its [data] table.
std::string tree_job_with(const std::string& keys) {
  const std::string dataset = "dataset = \"listops\"\n";
  std::string text = kTreeJob;
  return text.insert(text.find(dataset) + dataset.size(), keys);
}

TEST(JobNodesTest, NodesAreReadWithTheirDefaults) {
  std::optional<job_config> config = parse(kRnnJob);
  ASSERT_TRUE(config);
  EXPECT_TRUE(config->model.layers.empty());
  ASSERT_EQ(config->model.nodes.size(), 3u);
  const graph_node_spec& embed = config->model.nodes[0];
  EXPECT_EQ(embed.name, "embed");
  EXPECT_EQ(embed.route, node_route::chain);
  EXPECT_EQ(embed.emit, node_emit::every);
  EXPECT_EQ(embed.next, "cell");
  ASSERT_EQ(embed.layers.size(), 1u);
  EXPECT_EQ(embed.layers[0].type, "embedding");
  EXPECT_EQ(embed.layers[0].dim, 4);
  const graph_node_spec& cell = config->model.nodes[1];
  EXPECT_EQ(cell.route, node_route::loop);
  ASSERT_EQ(cell.layers.size(), 2u);
  EXPECT_EQ(cell.layers[1].type, "tanh");
  EXPECT_EQ(config->model.nodes[2].next, "");
  EXPECT_EQ(config->data.dataset, dataset_kind::text_records);
  EXPECT_EQ(config->data.path, "/usr/share/games/fortunes");

  std::optional<job_config> tree = parse(kTreeJob);
  ASSERT_TRUE(tree);
  EXPECT_EQ(tree->model.nodes[1].route, node_route::tree);
  EXPECT_EQ(tree->model.nodes[1].emit, node_emit::root);
}

TEST(JobNodesTest, ConfigJsonHoldsTheNodesAndSurvivesARoundTrip) {
  std::optional<job_config> config = parse(tree_job_with("max_depth = 6\n"));
  ASSERT_TRUE(config);
  const nlohmann::json json = to_json(*config);
  EXPECT_FALSE(json["model"].contains("layers"));
  ASSERT_EQ(json["model"]["nodes"].size(), 3u);
  EXPECT_EQ(json["model"]["nodes"][1]["route"], "tree");
  EXPECT_EQ(json["model"]["nodes"][1]["emit"], "root");
  EXPECT_EQ(json["model"]["nodes"][1]["next"], "head");
  EXPECT_EQ(json["model"]["nodes"][1]["layers"][0]["out"], 8);
  EXPECT_EQ(json["data"]["max_depth"], 6);
  EXPECT_EQ(json["data"]["max_arguments"], 5);
  EXPECT_EQ(json["data"]["seed"], 1);

  std::optional<job_config> again = parse(json_to_toml(json));
  ASSERT_TRUE(again);
  EXPECT_EQ(to_json(*again), json);
  EXPECT_EQ(config_hash(*again), config_hash(*config));
}

TEST(JobNodesTest, AChainJobWritesNeitherNodesNorTheListopsKeys) {
  std::optional<job_config> config = parse(kMinimal);
  ASSERT_TRUE(config);
  const nlohmann::json json = to_json(*config);
  EXPECT_TRUE(json["model"].contains("layers"));
  EXPECT_FALSE(json["model"].contains("nodes"));
  for (const char* key : {"max_depth", "max_arguments", "seed"}) {
    EXPECT_FALSE(json["data"].contains(key)) << key;
  }
  // Set on data they do not concern, the generator's keys change nothing a run records.
  EXPECT_EQ(config_hash(*parse(kMinimal + "[data]\nmax_depth = 9\nseed = 5\n")),
            config_hash(*config));
}

TEST(JobNodesTest, TheGeneratorsKeysShapeAListopsJobsHash) {
  const std::string hash = checkpoint_config_hash(*parse(kTreeJob));
  EXPECT_NE(checkpoint_config_hash(*parse(kTreeJob, {"data.seed=2"})), hash);
  EXPECT_NE(checkpoint_config_hash(*parse(kTreeJob, {"data.max_depth=3"})), hash);
  EXPECT_NE(checkpoint_config_hash(*parse(kTreeJob, {"data.max_arguments=2"})), hash);
  EXPECT_NE(checkpoint_config_hash(*parse(kTreeJob, {"model.nodes.tree.emit=every"})), hash);
}

TEST(JobNodesTest, ANodesKeyIsSetFromTheCommandLine) {
  std::optional<job_config> config =
      parse(kRnnJob, {"model.nodes.cell.route=tree", "model.nodes.head.layers=[{type=\"relu\"}]"});
  ASSERT_TRUE(config);
  EXPECT_EQ(config->model.nodes[1].route, node_route::tree);
  EXPECT_EQ(config->model.nodes[2].layers[0].type, "relu");
  EXPECT_EQ(error_of(kRnnJob, {"model.nodes.cel.route=tree"}),
            "job.toml: override of 'model.nodes.cel.route': no node of model.nodes is named "
            "\"cel\"");
  EXPECT_EQ(error_of(kRnnJob, {"model.nodes.cell=1"}),
            "job.toml: malformed override 'model.nodes.cell=1': a node's key is set as "
            "model.nodes.NAME.KEY=value");
  EXPECT_EQ(error_of(kRnnJob, {"model.nodes.cell.route=lop"}),
            "job.toml: model.nodes[1] (\"cell\").route must be one of 'chain', 'loop', 'tree', "
            "got 'lop'; did you mean 'loop'?");
  EXPECT_THAT(error_of(kMinimal, {"model.nodes.cell.route=loop"}),
              HasSubstr("no node of model.nodes is named \"cell\""));
}

TEST(JobNodesTest, ANodesMistakeNamesTheNodeAndTheKey) {
  const std::string records = "[data]\ndataset = \"text-records\"\n";
  EXPECT_EQ(error_of(records + node_table("a", "{ type = \"linear\", out = 2 }", "rout = 1\n")),
            "job.toml: unknown key 'model.nodes[0] (\"a\").rout'; did you mean "
            "'model.nodes[0] (\"a\").route'?");
  EXPECT_EQ(error_of(records + "[[model.nodes]]\nlayers = [{ type = \"relu\" }]\n"),
            "job.toml: missing required key 'model.nodes[0].name'");
  EXPECT_EQ(error_of(records + "[[model.nodes]]\nname = \"a\"\n"),
            "job.toml: missing required key 'model.nodes[0] (\"a\").layers'");
  EXPECT_EQ(error_of(records + node_table("a.b", "{ type = \"relu\" }")),
            "job.toml: model.nodes[0] (\"a.b\").name must be letters, digits, '_' and '-', got "
            "\"a.b\"");
  EXPECT_EQ(error_of(records + node_table("a", "{ type = \"linear\" }")),
            "job.toml: model.nodes[0] (\"a\").layers[0] (linear): missing required key 'out'");
  EXPECT_EQ(error_of(records + node_table("a", "{ type = \"relu\" }", "emit = \"last\"\n")),
            "job.toml: model.nodes[0] (\"a\").emit must be one of 'every', 'root', got 'last'");
  EXPECT_EQ(error_of(records + "[model]\nnodes = [3]\n"),
            "job.toml: model.nodes[0] must be a table ([[model.nodes]] with name, layers, route, "
            "emit, next), got an integer");
}

TEST(JobNodesTest, AModelIsAChainOrAGraphOnInstances) {
  EXPECT_EQ(error_of(kRnnJob + "[model]\nlayers = [{ type = \"relu\" }]\n"),
            "job.toml: model.layers and model.nodes are both set: a model is a chain of blocks "
            "(model.layers) or a graph of nodes (model.nodes), not both");
  EXPECT_EQ(error_of(kRnnJob, {"data.dataset=text"}),
            "job.toml: model.nodes needs data of instances of their own sizes, data.dataset = "
            "\"text-records\" or \"listops\", but data.dataset is \"text\"");
  EXPECT_EQ(error_of(kRnnJob, {"parallelism.stages=4"}),
            "job.toml: parallelism.stages (4) exceeds the number of nodes in model.nodes (3)");
  // A graph is cut between nodes, counted in the order rows visit them.
  std::optional<job_config> cut =
      parse(kRnnJob, {"parallelism.stages=2", "parallelism.partition=[1]"});
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->parallelism.partition, "1");
  EXPECT_EQ(error_of(kRnnJob, {"parallelism.stages=2", "parallelism.partition=[\"1:4\"]"}),
            "job.toml: parallelism.partition [1:4]: a graph (model.nodes) is cut between nodes, "
            "at node indices in the order rows visit them (as `troupe train` prints the stages), "
            "not inside a layer");
  EXPECT_EQ(error_of(kRnnJob, {"parallelism.stages=2", "parallelism.partition=[3]"}),
            "job.toml: parallelism.partition [3] must be increasing node indices in [1, 2] "
            "(model.nodes has 3 nodes, counted in the order rows visit them)");
  std::optional<job_config> three = parse(kRnnJob, {"parallelism.stages=3"});
  ASSERT_TRUE(three);
  EXPECT_EQ(three->parallelism.micro_batches, 4);  // a sync pipeline: a key per stage at least
}

TEST(JobNodesTest, TheGeneratorsKeysAreRangeChecked) {
  EXPECT_EQ(error_of(tree_job_with("max_depth = 0\n")),
            "job.toml: data.max_depth must be in [1, 100], got 0");
  EXPECT_EQ(error_of(kTreeJob, {"data.max_arguments=101"}),
            "job.toml: data.max_arguments must be in [2, 100], got 101 (from --set)");
  EXPECT_EQ(error_of(tree_job_with("max_arguments = 1\n")),
            "job.toml: data.max_arguments must be in [2, 100], got 1");
  EXPECT_EQ(error_of(tree_job_with("context = 3\n")),
            "job.toml: data.context must be at least 4 for listops data (the shortest list, "
            "[MAX 1 2 ]), got 3");
  EXPECT_EQ(error_of(tree_job_with("seed = -1\n")), "job.toml: data.seed must be >= 0, got -1");
  EXPECT_EQ(error_of(tree_job_with("seed = \"x\"\n")),
            "job.toml: data.seed must be an integer, got a string");
  std::optional<job_config> config = parse(kTreeJob, {"data.max_depth=100", "data.seed=7"});
  ASSERT_TRUE(config);
  EXPECT_EQ(config->data.max_depth, 100);
  EXPECT_EQ(config->data.seed, 7u);
}

TEST(JobNodesTest, TheGeneratorsKeysOnOtherDataAreIdle) {
  std::vector<std::string> warnings;
  job_error error;
  ASSERT_TRUE(parse_job(kMinimal + "[data]\nmax_depth = 3\n", "job.toml", {}, &error, &warnings))
      << error.message;
  EXPECT_THAT(warnings,
              ::testing::ElementsAre("job.toml: data.max_depth does nothing with data.dataset = "
                                     "\"fashion-mnist\""));
  ASSERT_TRUE(
      parse_job(tree_job_with("max_depth = 3\ncontext = 64\n"), "job.toml", {}, &error, &warnings))
      << error.message;
  EXPECT_THAT(warnings, ::testing::IsEmpty());
}

TEST(JobNodesTest, PaddingIsReadCheckedAndWrittenOnlyWhenSet) {
  std::optional<job_config> plain = parse(kRnnJob);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->data.padding, padding_kind::none);
  EXPECT_FALSE(to_json(*plain)["data"].contains("padding"));
  EXPECT_EQ(config_hash(*parse(kRnnJob, {"data.padding=\"none\""})), config_hash(*plain));
  std::optional<job_config> padded = parse(kRnnJob, {"data.padding=\"longest\""});
  ASSERT_TRUE(padded);
  EXPECT_EQ(padded->data.padding, padding_kind::longest);
  EXPECT_EQ(to_json(*padded)["data"]["padding"], "longest");
  EXPECT_NE(config_hash(*padded), config_hash(*plain));
  EXPECT_EQ(error_of(kTreeJob, {"data.padding=\"longest\""}),
            "job.toml: data.padding = \"longest\" pads sequence instances (data.dataset = "
            "\"text-records\" with model.nodes), but data.dataset is \"listops\"");
  EXPECT_THAT(error_of(kRnnJob, {"data.padding=\"shortest\""}),
              HasSubstr("data.padding must be one of 'none', 'longest', got 'shortest'"));
}

}  // namespace
}  // namespace troupe::actors
