// The checks of a graph model: one line for each way a graph can be wrong, naming the node, and
// the per-row widths of a valid graph's nodes.

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "actors/config/job_data.h"
#include "actors/config/model_graph_checks.h"
#include "tests/actors/config/job_file_test_support.h"

namespace troupe::actors {
namespace {

using ::testing::HasSubstr;
using namespace job_file_testing;

const std::string kRecords = "[data]\ndataset = \"text-records\"\n";
const std::string kEmbed = "{ type = \"embedding\", vocab = 256, dim = 4 }";
const std::string kCell = "{ type = \"linear\", out = 8 }, { type = \"tanh\" }";

/// check_model_graph()'s message for the graph of `text` on data of `arity`, "" when valid.
std::string graph_error(const std::string& text, int arity,
                        const std::vector<std::string>& overrides = {}) {
  std::optional<job_config> config = parse(text, overrides);
  if (!config) return "the job does not parse";
  std::string error;
  const bool valid = check_model_graph(*config, arity, &error);
  EXPECT_EQ(valid, error.empty()) << error;
  return error;
}

void expect_widths(const graph_node_widths& got, int64_t input, int64_t blocks_input,
                   int64_t output, bool per_part) {
  EXPECT_EQ(got.input, input);
  EXPECT_EQ(got.blocks_input, blocks_input);
  EXPECT_EQ(got.output, output);
  EXPECT_EQ(got.emits_per_part, per_part);
}

TEST(ModelGraphTest, AnElmanNetworksWidths) {
  std::optional<job_config> config = parse(kRnnJob);
  ASSERT_TRUE(config);
  std::string error;
  auto widths = model_graph_widths(*config, 1, &error);
  ASSERT_TRUE(widths) << error;
  ASSERT_EQ(widths->size(), 3u);
  expect_widths((*widths)[0], 1, 1, 4, true);  // a token id in, its embedding out
  expect_widths((*widths)[1], 4, 4 + 8, 8, true);
  expect_widths((*widths)[2], 8, 8, 256, true);
  EXPECT_EQ(model_graph_order(*config), (std::vector<size_t>{0, 1, 2}));
}

TEST(ModelGraphTest, ATreeNodesRowsHoldItsChildrensOutputs) {
  std::optional<job_config> config = parse(kTreeJob);
  ASSERT_TRUE(config);
  std::string error;
  auto widths = model_graph_widths(*config, 2, &error);
  ASSERT_TRUE(widths) << error;
  expect_widths((*widths)[1], 4, 4 + 2 * 8, 8, false);
  expect_widths((*widths)[2], 8, 8, 10, false);
  auto ternary = model_graph_widths(*config, 3, &error);
  ASSERT_TRUE(ternary) << error;
  EXPECT_EQ((*ternary)[1].blocks_input, 4 + 3 * 8);
}

TEST(ModelGraphTest, AChainNodeAfterTheFirstSeesEachRowAsOneToken) {
  // A GPT over whole records: the blocks after the embedding take [tokens, width] rows.
  const std::string gpt =
      kRecords +
      node_table("embed",
                 "{ type = \"embedding\", vocab = 256, dim = 8, positions = 16 }, "
                 "{ type = \"transformer_block\", heads = 2 }",
                 "next = \"top\"\n") +
      node_table("top",
                 "{ type = \"transformer_block\", heads = 2 }, { type = \"layernorm\" }, "
                 "{ type = \"lm_head\", vocab = 256 }");
  std::optional<job_config> config = parse(gpt);
  ASSERT_TRUE(config);
  std::string error;
  auto widths = model_graph_widths(*config, 1, &error);
  ASSERT_TRUE(widths) << error;
  expect_widths((*widths)[0], 1, 1, 8, true);
  expect_widths((*widths)[1], 8, 8, 256, true);
  EXPECT_EQ((*widths)[0].blocks_shape(), (layers::shape{1}));  // a token id
  EXPECT_EQ((*widths)[1].blocks_shape(), (layers::shape{1, 8}));
  // A loop node's rows stay flat: [x | h] for its cell.
  auto rnn = model_graph_widths(*parse(kRnnJob), 1, &error);
  ASSERT_TRUE(rnn) << error;
  EXPECT_EQ((*rnn)[1].blocks_shape(), (layers::shape{12}));
  EXPECT_EQ((*rnn)[2].blocks_shape(), (layers::shape{1, 8}));
  EXPECT_THAT(graph_error(gpt, 1,
                          {"model.nodes.top.layers=[{type=\"transformer_block\", "
                           "heads=3}]"}),
              HasSubstr("heads (3) must divide the width 8"));
}

TEST(ModelGraphTest, ExplicitPositionsMustCoverTheLongestInstance) {
  // Positions count from 0 in each instance, so the loaded data's longest one decides.
  std::optional<job_config> config =
      parse(kTreeJob, {"data.synthetic_train=16", "data.synthetic_test=4",
                       "model.nodes.embed.layers=[{type=\"embedding\", vocab=20, dim=4, "
                       "positions=2}]"});
  ASSERT_TRUE(config);
  std::string error;
  EXPECT_FALSE(load_job_data(*config, &error));
  EXPECT_THAT(error, HasSubstr("model.nodes[0] (\"embed\") layers[0] (embedding): positions = 2, "
                               "but the listops data has instances of "));
  EXPECT_THAT(error, HasSubstr("positions count from 0 in each instance"));
  config->model.nodes[0].layers[0].positions = 1000;
  EXPECT_TRUE(load_job_data(*config, &error)) << error;
}

TEST(ModelGraphTest, NodesRunInTheOrderOfTheirEdges) {
  const std::string text = kRecords + node_table("embed", kEmbed, "next = \"cell\"\n") +
                           node_table("head", "{ type = \"linear\", out = 256 }") +
                           node_table("cell", kCell, "route = \"loop\"\nnext = \"head\"\n");
  std::optional<job_config> config = parse(text);
  ASSERT_TRUE(config);
  EXPECT_EQ(model_graph_order(*config), (std::vector<size_t>{0, 2, 1}));
  std::string error;
  auto widths = model_graph_widths(*config, 1, &error);
  ASSERT_TRUE(widths) << error;
  expect_widths((*widths)[2], 4, 12, 8, true);
  expect_widths((*widths)[1], 8, 8, 256, true);
}

TEST(ModelGraphTest, AnEdgeToAnUnknownNode) {
  EXPECT_EQ(graph_error(kRnnJob, 1, {"model.nodes.embed.next=cel"}),
            "model.nodes[0] (\"embed\"): next = \"cel\" names no node of model.nodes; did you "
            "mean 'cell'?");
}

TEST(ModelGraphTest, TwoNodesOfOneName) {
  EXPECT_EQ(graph_error(kRnnJob, 1, {"model.nodes.head.name=cell"}),
            "model.nodes[2] (\"cell\"): model.nodes[1] (\"cell\") has the same name; each node's "
            "name must be its own");
}

TEST(ModelGraphTest, ACycleOutsideALoopRule) {
  EXPECT_EQ(graph_error(kRnnJob, 1, {"model.nodes.head.next=cell"}),
            "model.nodes[1] (\"cell\"): a cycle outside a loop rule: cell -> head -> cell (a "
            "node revisits itself only by its own route = \"loop\" or \"tree\")");
  EXPECT_THAT(graph_error(kRnnJob, 1, {"model.nodes.cell.next=cell"}),
              HasSubstr("model.nodes[1] (\"cell\"): a cycle outside a loop rule: cell -> cell"));
}

TEST(ModelGraphTest, ALoopWithNoExit) {
  const std::string text = kRecords + node_table("embed", kEmbed, "next = \"cell\"\n") +
                           node_table("cell", kCell, "route = \"loop\"\n");
  EXPECT_EQ(graph_error(text, 1),
            "model.nodes[1] (\"cell\"): a loop with no exit: a node with route = \"loop\" needs "
            "`next`, the node its emitted rows go to");
  EXPECT_THAT(graph_error(text, 2, {"model.nodes.cell.route=tree"}),
              HasSubstr("a loop with no exit: a node with route = \"tree\""));
}

TEST(ModelGraphTest, AJoinWithNoWayToComplete) {
  const std::string text =
      "[data]\ndataset = \"listops\"\n" + node_table("embed", kEmbed, "next = \"words\"\n") +
      node_table("words", kCell, "route = \"tree\"\nemit = \"root\"\nnext = \"phrases\"\n") +
      node_table("phrases", kCell, "route = \"tree\"\nnext = \"head\"\n") +
      node_table("head", "{ type = \"linear\", out = 10 }");
  EXPECT_EQ(graph_error(text, 2),
            "model.nodes[2] (\"phrases\"): a join with no way to complete: model.nodes[1] "
            "(\"words\") before it emits only roots (emit = \"root\": one row per instance), so "
            "its route = \"tree\" never gets the parts of an instance");
  EXPECT_EQ(graph_error(text, 2, {"model.nodes.words.emit=every"}), "");
}

TEST(ModelGraphTest, RoutesMustFitTheData) {
  EXPECT_EQ(graph_error(kRnnJob, 1, {"model.nodes.cell.route=tree"}),
            "model.nodes[1] (\"cell\"): route = \"tree\" joins a part's children, but the data's "
            "parts have at most 1 child (sequences): use route = \"loop\"");
  EXPECT_EQ(graph_error(kTreeJob, 2, {"model.nodes.tree.route=loop"}),
            "model.nodes[1] (\"tree\"): route = \"loop\" follows a sequence, but the data are "
            "trees (arity 2): use route = \"tree\"");
  EXPECT_EQ(graph_error(kRnnJob, 1, {"model.nodes.head.emit=root"}),
            "model.nodes[2] (\"head\"): emit = \"root\" applies only to a node with route = "
            "\"loop\" or \"tree\"");
}

TEST(ModelGraphTest, OneLastNodeThatTheFirstReaches) {
  const std::string spare = node_table("spare", "{ type = \"relu\" }");
  EXPECT_EQ(graph_error(kRnnJob + spare, 1),
            "model.nodes[2] (\"head\") and model.nodes[3] (\"spare\") both have no `next`: a "
            "graph has one last node, whose rows go to the loss");
  EXPECT_EQ(
      graph_error(kRnnJob + node_table("side", "{ type = \"relu\" }", "next = \"head\"\n"), 1),
      "model.nodes[3] (\"side\"): no path from the first node, model.nodes[0] (\"embed\"), "
      "reaches it (the rows go from the first node along `next` only)");
}

TEST(ModelGraphTest, ShapesThatDoNotMeetSayWhatWidthWasExpected) {
  EXPECT_EQ(graph_error(kRnnJob, 1, {"model.nodes.cell.layers=[{type=\"tanh\"}]"}),
            "model.nodes[1] (\"cell\"): shapes do not meet: a loop node's rows are the 4 "
            "features model.nodes[0] (\"embed\") outputs per row, followed by its own output of "
            "4 for the part before: 8 in all, but on rows of 8 its blocks output 8, not 4 (begin "
            "the node with a block of fixed output width, such as linear)");
  EXPECT_EQ(
      graph_error(kRnnJob, 1,
                  {"model.nodes.cell.layers=[{type=\"embedding\", vocab=9, dim=1, positions=7}]"}),
      "model.nodes[1] (\"cell\").layers[0] (embedding): the context is 8 tokens but positions is "
      "7 (raise positions or lower data.context) (a loop node's rows are the 4 features "
      "model.nodes[0] (\"embed\") outputs per row, followed by its own output of 4 for the part "
      "before: 8 in all)");
  EXPECT_EQ(
      graph_error(kTreeJob, 2, {"model.nodes.head.layers=[{type=\"transformer_block\", heads=3}]"}),
      "model.nodes[2] (\"head\").layers[0] (transformer_block): heads (3) must divide the "
      "width 8 (its rows are the 8 features model.nodes[1] (\"tree\") outputs per row, "
      "each one token, [1, 8])");
  EXPECT_THAT(graph_error(kTreeJob, 2, {"model.nodes.embed.layers=[{type=\"layernorm\"}]"}),
              HasSubstr("got [1] (put an embedding before it) (its rows are a part's token "
                        "id (1 feature))"));
}

TEST(ModelGraphTest, CheckModelChecksAGraphAgainstItsDatasLabels) {
  std::string error;
  EXPECT_TRUE(check_model(*parse(kTreeJob), 10, &error)) << error;
  EXPECT_TRUE(check_model(*parse(kRnnJob), 256, &error)) << error;
  EXPECT_FALSE(check_model(*parse(kTreeJob, {"model.nodes.head.layers=[{type=\"linear\", out=7}]"}),
                           10, &error));
  EXPECT_EQ(error,
            "model.nodes[2] (\"head\"): the last node must output one score per class, 10, but "
            "outputs 7 per row");
  EXPECT_FALSE(check_model(*parse(kTreeJob, {"model.nodes.tree.emit=every"}), 10, &error));
  EXPECT_THAT(error, HasSubstr("listops labels each instance once"));
  EXPECT_FALSE(check_model(*parse(kRnnJob, {"model.nodes.cell.emit=root"}), 256, &error));
  EXPECT_THAT(error, HasSubstr("text-records labels every part"));
  // check_model() takes the arity listops data will have: binary trees.
  EXPECT_FALSE(check_model(*parse(kTreeJob, {"model.nodes.tree.route=loop"}), 10, &error));
  EXPECT_THAT(error, HasSubstr("the data are trees (arity 2)"));
}

}  // namespace
}  // namespace troupe::actors
