// Model graphs on the CPU: the routes (split, join, loop, conditional, gather) and the forward
// and backward passes over keys of instances of different sizes, checked against the same
// instances run one by one and against finite differences.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "actors/engine/graph_program.h"
#include "actors/engine/graph_routes.h"
#include "layers/cpu/cpu_backend.h"
#include "tests/support/job_helpers.h"
#include "tests/support/test_helpers.h"

namespace troupe::actors {
namespace {

using testing::block;

using instances_ptr = std::shared_ptr<const std::vector<layers::instance>>;

layers::layer_spec embedding(int vocab, int dim) {
  layers::layer_spec spec = block("embedding");
  spec.vocab = vocab;
  spec.dim = dim;
  return spec;
}

/// embed → an Elman cell looped over each sequence (or joined over each tree) → head.
struct test_graph {
  std::vector<graph_node_spec> nodes;
  std::vector<graph_node_widths> widths;
  int arity = 1;
};

test_graph language_model() {
  test_graph graph;
  graph.nodes = {
      testing::graph_node("embed", {embedding(8, 3)}, node_route::chain, node_emit::every, "cell"),
      testing::graph_node("cell", {block("linear", 4), block("tanh")}, node_route::loop,
                          node_emit::every, "head"),
      testing::graph_node("head", {block("linear", 8)}, node_route::chain, node_emit::every, "")};
  graph.widths = {{1, 1, 3, true}, {3, 3 + 4, 4, true}, {4, 4, 8, true}};
  return graph;
}

test_graph tree_classifier() {
  test_graph graph;
  graph.nodes = {
      testing::graph_node("embed", {embedding(6, 3)}, node_route::chain, node_emit::every, "cell"),
      testing::graph_node("cell", {block("linear", 4), block("tanh")}, node_route::tree,
                          node_emit::root, "head"),
      testing::graph_node("head", {block("linear", 5)}, node_route::chain, node_emit::every, "")};
  graph.widths = {{1, 1, 3, true}, {3, 3 + 2 * 4, 4, false}, {4, 4, 5, false}};
  graph.arity = 2;
  return graph;
}

layers::layer_spec transformer_block() {
  layers::layer_spec spec = block("transformer_block");
  spec.heads = 2;
  return spec;
}

/// A GPT over whole sequences: embed (with positions counted in each sequence) and a block, then
/// a block, layernorm and lm_head; every node's rows one per part, attention within each
/// sequence.
test_graph gpt() {
  layers::layer_spec embed = embedding(8, 8);
  embed.positions = 6;
  layers::layer_spec head = block("lm_head");
  head.vocab = 8;
  test_graph graph;
  graph.nodes = {testing::graph_node("embed", {embed, transformer_block()}, node_route::chain,
                                     node_emit::every, "top"),
                 testing::graph_node("top", {transformer_block(), block("layernorm"), head},
                                     node_route::chain, node_emit::every, "")};
  graph.widths = {{1, 1, 8, true, false}, {8, 8, 8, true, true}};
  return graph;
}

layers::instance sequence(std::vector<int32_t> tokens) {
  layers::instance item;
  item.tokens = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) item.labels.push_back((tokens[i] + 1) % 8);
  return item;
}

layers::instance tree(std::vector<int32_t> tokens, std::vector<int32_t> parent, int label) {
  layers::instance item;
  item.tokens = std::move(tokens);
  item.parent = std::move(parent);
  item.labels = {label};
  return item;
}

std::vector<layers::instance> sequences() {
  return {sequence({1, 2, 3}), sequence({4}), sequence({5, 6, 7, 0, 1})};
}

/// ((a b) c) with a, b, c leaves; a lone leaf; (a (b c)).
std::vector<layers::instance> trees() {
  return {tree({1, 2, 0, 3, 0}, {2, 2, 4, 4, -1}, 3), tree({5}, {-1}, 1),
          tree({1, 2, 3, 0, 0}, {4, 3, 3, 4, -1}, 0)};
}

layers::tensor token_rows(layers::backend& device, const std::vector<layers::instance>& items) {
  std::vector<float> ids;
  for (const layers::instance& item : items)
    for (int32_t token : item.tokens) ids.push_back(static_cast<float>(token));
  return layers::tensor::from_host(device, device.default_stream(),
                                   {static_cast<int64_t>(ids.size()), 1}, ids);
}

class GraphProgramTest : public ::testing::Test {
 protected:
  std::unique_ptr<layers::backend> device_ = layers::make_cpu_backend(1);
  layers::stream stream_ = device_->default_stream();
  layers::run_options options_{stream_, layers::pass_mode::training, 7, 0, false};

  std::unique_ptr<graph_program> build(const test_graph& graph, size_t first, size_t last) {
    return std::make_unique<graph_program>(*device_, stream_, graph.nodes, graph.widths, first,
                                           last, graph.arity, 42);
  }

  /// sum(upstream ⊙ output) over the key, and (when `gradients`) each parameter's gradient.
  double objective(graph_program& program, const std::vector<layers::instance>& items,
                   const std::vector<float>& upstream,
                   std::vector<std::vector<float>>* gradients = nullptr) {
    auto shared = std::make_shared<const std::vector<layers::instance>>(items);
    graph_tape tape;
    layers::tensor output = program.forward(options_, token_rows(*device_, items), shared, &tape);
    const std::vector<float> values = output.to_host(stream_);
    double sum = 0;
    for (size_t i = 0; i < values.size(); ++i) sum += static_cast<double>(values[i]) * upstream[i];
    if (gradients) {
      for (layers::parameter* p : program.parameters()) p->has_gradient = false;
      program.backward(options_, tape,
                       layers::tensor::from_host(*device_, stream_, output.dims(), upstream),
                       false);
      gradients->clear();
      for (layers::parameter* p : program.parameters())
        gradients->push_back(p->gradient.to_host(stream_));
    }
    return sum;
  }

  /// Central differences of the objective in every weight, against backward(), which may differ
  /// by `tolerance` + 1e-2 × |numeric|.
  void check_gradients(const test_graph& graph, const std::vector<layers::instance>& items,
                       double tolerance = 2e-3) {
    check_gradients(*build(graph, 0, graph.nodes.size()), items, tolerance);
  }

  void check_gradients(graph_program& built, const std::vector<layers::instance>& items,
                       double tolerance) {
    graph_program* program = &built;
    const int64_t rows = program->output_rows(layout_of(items));
    const std::vector<float> upstream =
        testing::random_values(static_cast<size_t>(rows * program->output_width()), 3);
    std::vector<std::vector<float>> analytic;
    objective(*program, items, upstream, &analytic);
    const std::vector<layers::parameter*> parameters = program->parameters();
    const std::vector<std::string> names = program->parameter_names();
    ASSERT_EQ(names.size(), parameters.size());
    for (size_t p = 0; p < parameters.size(); ++p) {
      std::vector<float> values = parameters[p]->value.to_host(stream_);
      for (size_t i = 0; i < values.size(); ++i) {
        const float saved = values[i];
        double side[2];
        for (int sign = 0; sign < 2; ++sign) {
          values[i] = saved + (sign ? -1e-2f : 1e-2f);
          parameters[p]->value.copy_from_host(stream_, values.data());
          side[sign] = objective(*program, items, upstream);
        }
        values[i] = saved;
        parameters[p]->value.copy_from_host(stream_, values.data());
        const double numeric = (side[0] - side[1]) / 2e-2;
        EXPECT_NEAR(analytic[p][i], numeric, tolerance + 1e-2 * std::fabs(numeric))
            << names[p] << " element " << i;
      }
    }
  }
};

TEST(GraphRoutesTest, ALoopVisitsEachPositionOfEveryInstanceAtOnce) {
  const recurrence_plan plan = plan_recurrence(sequences(), 1, node_emit::every);
  // Lengths 3, 1, 5: part rows 0-2, 3, 4-8. Position 0 of all three first.
  ASSERT_EQ(plan.visits.size(), 5u);
  EXPECT_EQ(plan.visits[0].parts, (std::vector<int64_t>{0, 3, 4}));
  EXPECT_EQ(plan.visits[0].children, (std::vector<int64_t>{-1, -1, -1}));
  EXPECT_EQ(plan.visits[1].parts, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(plan.visits[1].children, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(plan.visits[4].parts, (std::vector<int64_t>{8}));
  EXPECT_EQ(plan.emitted.size(), 9u);
  EXPECT_EQ(plan_recurrence(sequences(), 1, node_emit::root).emitted,
            (std::vector<int64_t>{2, 3, 8}));
}

TEST(GraphRoutesTest, ATreeNodeJoinsItsChildrenInOrderOnceBothAreDone) {
  const recurrence_plan plan = plan_recurrence(trees(), 2, node_emit::root);
  // Part rows: tree 0 is 0-4, the lone leaf 5, tree 2 is 6-10.
  ASSERT_EQ(plan.visits.size(), 3u);
  EXPECT_EQ(plan.visits[0].parts, (std::vector<int64_t>{0, 1, 3, 5, 6, 7, 8}));
  EXPECT_EQ(plan.visits[1].parts, (std::vector<int64_t>{2, 9}));
  EXPECT_EQ(plan.visits[1].children, (std::vector<int64_t>{0, 1, 7, 8}));
  EXPECT_EQ(plan.visits[2].parts, (std::vector<int64_t>{4, 10}));
  EXPECT_EQ(plan.visits[2].children, (std::vector<int64_t>{2, 3, 6, 9}));
  EXPECT_EQ(plan.emitted, (std::vector<int64_t>{4, 5, 10}));
}

TEST(GraphRoutesTest, RowLabelsFollowTheLastNodesRows) {
  std::string error;
  EXPECT_EQ(row_labels(trees(), row_unit::instance, &error), (std::vector<int32_t>{3, 1, 0}));
  EXPECT_EQ(row_labels(sequences(), row_unit::part, &error).size(), 9u);
  EXPECT_TRUE(row_labels(trees(), row_unit::part, &error).empty());
  EXPECT_NE(error.find("instance 0 has 1 labels"), std::string::npos) << error;
}

TEST_F(GraphProgramTest, LoopGradientsMatchFiniteDifferences) {
  check_gradients(language_model(), sequences());
}

TEST_F(GraphProgramTest, TreeGradientsMatchFiniteDifferences) {
  check_gradients(tree_classifier(), trees());
}

TEST_F(GraphProgramTest, GptOverWholeSequencesGradientsMatchFiniteDifferences) {
  auto program = build(gpt(), 0, 2);
  // The embedding's own scale (0.02) is too small for steps of 1e-2 through the layernorm
  // after it: embeddings of unit scale keep the differences in the linear range.
  const std::vector<layers::parameter*> parameters = program->parameters();
  const std::vector<std::string> names = program->parameter_names();
  for (size_t p = 0; p < parameters.size(); ++p) {
    if (names[p].rfind("embed.embedding0.", 0) != 0) continue;
    const std::vector<float> values = testing::random_values(parameters[p]->value.size(), 11 + p);
    parameters[p]->value.copy_from_host(stream_, values.data());
    device_->synchronize(stream_);
  }
  // A transformer's sums run over more terms: the block checker's tolerance.
  check_gradients(*program, sequences(), 3e-3);
}

TEST_F(GraphProgramTest, AKeyOfInstancesEqualsTheInstancesOneByOne) {
  for (const test_graph& graph : {language_model(), tree_classifier(), gpt()}) {
    SCOPED_TRACE(graph.nodes[1].name + " of arity " + std::to_string(graph.arity));
    const std::vector<layers::instance> items = graph.arity == 1 ? sequences() : trees();
    auto program = build(graph, 0, graph.nodes.size());
    const int64_t width = program->output_width();
    const int64_t rows = program->output_rows(layout_of(items));
    const std::vector<float> upstream =
        testing::random_values(static_cast<size_t>(rows * width), 5);
    std::vector<std::vector<float>> together;
    const double whole = objective(*program, items, upstream, &together);
    // The same instances as keys of one, their upstream rows in turn; gradients summed.
    double sum = 0;
    std::vector<std::vector<float>> summed;
    size_t offset = 0;
    for (const layers::instance& item : items) {
      const std::vector<layers::instance> one{item};
      const size_t count = static_cast<size_t>(program->output_rows(layout_of(one)) * width);
      std::vector<std::vector<float>> gradients;
      sum += objective(*program, one,
                       {upstream.begin() + offset, upstream.begin() + offset + count}, &gradients);
      offset += count;
      if (summed.empty()) summed.assign(gradients.size(), {});
      for (size_t p = 0; p < gradients.size(); ++p) {
        summed[p].resize(gradients[p].size(), 0.0f);
        for (size_t i = 0; i < gradients[p].size(); ++i) summed[p][i] += gradients[p][i];
      }
    }
    EXPECT_NEAR(whole, sum, 1e-5 * (1 + std::fabs(whole)));
    for (size_t p = 0; p < summed.size(); ++p)
      for (size_t i = 0; i < summed[p].size(); ++i)
        EXPECT_NEAR(together[p][i], summed[p][i], 1e-5 * (1 + std::fabs(summed[p][i])))
            << "parameter " << p << " element " << i;
  }
}

TEST_F(GraphProgramTest, AProgramCutBetweenNodesEqualsTheWhole) {
  const test_graph graph = tree_classifier();
  const std::vector<layers::instance> items = trees();
  auto shared = std::make_shared<const std::vector<layers::instance>>(items);
  auto whole = build(graph, 0, 3);
  auto front = build(graph, 0, 2);
  auto back = build(graph, 2, 3);
  EXPECT_EQ(back->input_rows(layout_of(items)), 3);  // after a node that emits roots
  const layers::tensor input = token_rows(*device_, items);
  const std::vector<float> expected =
      whole->forward(options_, input, shared, nullptr).to_host(stream_);
  const layers::tensor middle = front->forward(options_, input, shared, nullptr);
  EXPECT_EQ(back->forward(options_, middle, shared, nullptr).to_host(stream_), expected);
  EXPECT_EQ(whole->parameter_names(),
            (std::vector<std::string>{"embed.embedding0.weight", "embed.embedding0.position",
                                      "cell.linear0.weight", "cell.linear0.bias",
                                      "head.linear0.weight", "head.linear0.bias"}));
}

TEST_F(GraphProgramTest, AGptCutBetweenNodesEqualsTheWhole) {
  const test_graph graph = gpt();
  const std::vector<layers::instance> items = sequences();
  auto shared = std::make_shared<const std::vector<layers::instance>>(items);
  auto whole = build(graph, 0, 2);
  auto front = build(graph, 0, 1);
  auto back = build(graph, 1, 2);
  const layers::tensor input = token_rows(*device_, items);
  const std::vector<float> expected =
      whole->forward(options_, input, shared, nullptr).to_host(stream_);
  EXPECT_EQ(expected.size(), 9u * 8u);  // one row of 8 scores per part
  const layers::tensor middle = front->forward(options_, input, shared, nullptr);
  EXPECT_EQ(back->forward(options_, middle, shared, nullptr).to_host(stream_), expected);
}

TEST_F(GraphProgramTest, AGptPartSeesOnlyTheEarlierPartsOfItsOwnInstance) {
  auto program = build(gpt(), 0, 2);
  std::vector<layers::instance> items = sequences();  // part rows 0-2, 3, 4-8
  auto scores = [&](const std::vector<layers::instance>& key) {
    auto shared = std::make_shared<const std::vector<layers::instance>>(key);
    return program->forward(options_, token_rows(*device_, key), shared, nullptr).to_host(stream_);
  };
  const std::vector<float> before = scores(items);
  items[2].tokens[1] = 3;  // part row 5: the third instance's second part
  const std::vector<float> after = scores(items);
  const size_t width = 8;
  for (size_t row = 0; row < 9; ++row) {
    const bool same = std::equal(before.begin() + row * width, before.begin() + (row + 1) * width,
                                 after.begin() + row * width);
    EXPECT_EQ(same, row < 5) << "part row " << row;
  }
  // Positions count from 0 in each instance: the longest has 5 parts, so of the 6 learned
  // positions the first 5 get gradients and the last none.
  std::vector<std::vector<float>> gradients;
  objective(*program, items, testing::random_values(9 * width, 3), &gradients);
  const std::vector<std::string> names = program->parameter_names();
  const size_t position = static_cast<size_t>(
      std::find(names.begin(), names.end(), "embed.embedding0.position") - names.begin());
  ASSERT_LT(position, names.size());
  for (size_t row = 0; row < 6; ++row) {
    const auto first = gradients[position].begin() + row * width;
    const bool zero = std::all_of(first, first + width, [](float g) { return g == 0.0f; });
    EXPECT_EQ(zero, row == 5) << "position " << row;
  }
}

}  // namespace
}  // namespace troupe::actors
