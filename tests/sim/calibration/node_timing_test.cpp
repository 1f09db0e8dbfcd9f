// Calibration of a model graph: the row counts its nodes are timed at follow the visits of the
// job's own keys, the keys are seeded draws of its data, the node tables are fitted to what the
// stages measured, and a calibrated profile of a graph job times its nodes and simulates it.

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "actors/config/job_data.h"
#include "actors/engine/training_run.h"
#include "sim/calibration/block_timing.h"
#include "sim/calibration/calibrate.h"
#include "sim/calibration/graph_stage_timing.h"
#include "sim/calibration/node_timing.h"
#include "sim/profile.h"
#include "tests/sim/simulation_fixtures.h"

namespace troupe::sim {
namespace {

/// A file of `count` records in fortune's format, of 3 to 40 lowercase letters each.
std::string records_file(int count) {
  const std::string path = ::testing::TempDir() + "/node_timing_records.txt";
  std::ofstream file(path);
  for (int r = 0; r < count; ++r) {
    for (int i = 0; i < 3 + (r * 7) % 38; ++i) file << static_cast<char>('a' + (r + i) % 26);
    file << "\n%\n";
  }
  return path;
}

TEST(NodeTimingTest, NodesAreTimedAtPowersOfTwoUpToTheirKeysLargestVisit) {
  EXPECT_EQ(timed_rows({3, 5, 40, 7}), (std::vector<int64_t>{2, 4, 8, 16, 32, 40}));
  EXPECT_EQ(timed_rows({16, 16}), (std::vector<int64_t>{16}));
  EXPECT_EQ(timed_rows({1}), (std::vector<int64_t>{1}));
  // At most so many row counts, the largest kept.
  EXPECT_EQ(timed_rows({1, 10000}, 3), (std::vector<int64_t>{4096, 8192, 10000}));
}

TEST(NodeTimingTest, SampleKeysAreSeededDrawsOfTheData) {
  const actors::job_config config = graph_job(true, 1, "async");
  std::string error;
  auto data = actors::load_job_data(config, &error);
  ASSERT_TRUE(data) << error;
  const auto& train = *data->train.instances;
  const auto keys = sample_keys(train, 8, 5, 7);
  ASSERT_EQ(keys.size(), 5u);
  for (const auto& key : keys) EXPECT_EQ(key.size(), 8u);
  const auto again = sample_keys(train, 8, 5, 7);
  const auto other = sample_keys(train, 8, 5, 8);
  bool same = true, differs = false;
  for (size_t k = 0; k < keys.size(); ++k) {
    for (size_t i = 0; i < keys[k].size(); ++i) {
      same = same && keys[k][i].tokens == again[k][i].tokens;
      differs = differs || keys[k][i].tokens != other[k][i].tokens;
    }
  }
  EXPECT_TRUE(same);
  EXPECT_TRUE(differs);
}

TEST(NodeTimingTest, EachStagesNodesAreScaledToWhatTheStageMeasured) {
  std::vector<node_profile> nodes(3);
  for (node_profile& node : nodes) {
    node.rows = {1, 4};
    node.forward_s = node.evaluate_s = {1.0, 2.0};
    node.backward_s = node.backward_first_s = {2.0, 4.0};
    node.step_s = 1.0;
  }
  graph_stage_timing first;
  first.range = {0, 1};
  first.forward_s = 3, first.predicted_forward_s = 2;    // 1.5 times the model
  first.backward_s = 1, first.predicted_backward_s = 2;  // half
  first.step_s = 4;
  graph_stage_timing second;
  second.range = {1, 3};
  second.forward_s = 2, second.predicted_forward_s = 2;
  second.backward_s = 2, second.predicted_backward_s = 2;
  second.step_s = 1;  // the two nodes' steps together
  fit_nodes_to_stages({first, second}, &nodes);
  EXPECT_EQ(nodes[0].forward_s, (std::vector<double>{1.5, 3.0}));
  EXPECT_EQ(nodes[0].evaluate_s, (std::vector<double>{1.5, 3.0}));
  EXPECT_EQ(nodes[0].backward_s, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(nodes[0].backward_first_s, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(nodes[0].step_s, 4.0);
  EXPECT_EQ(nodes[2].forward_s, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(nodes[1].step_s + nodes[2].step_s, 1.0);
}

TEST(NodeTimingTest, CalibrationTimesAGraphsNodesAtItsKeysRowsAndSimulatesIt) {
  for (bool trees : {false, true}) {
    actors::job_config config = graph_job(trees, 2, "async");
    if (!trees) {
      // Byte sequences of 3 to 40 bytes, from a file of records (vocabulary 256).
      config.data.path = records_file(64);
      config.model.nodes[0].layers[0].vocab = 256;
      config.model.nodes[2].layers[0].out = 256;
    }
    std::string error;
    auto profile = calibrate(config, 0.01, &error);
    ASSERT_TRUE(profile) << error;
    EXPECT_TRUE(profile->blocks.empty());
    ASSERT_EQ(profile->nodes.size(), 3u) << trees;
    EXPECT_EQ(profile->nodes[1].name, "cell");
    for (const node_profile& node : profile->nodes) {
      ASSERT_FALSE(node.rows.empty());
      for (size_t i = 0; i < node.rows.size(); ++i) {
        if (i > 0) {
          EXPECT_GT(node.rows[i], node.rows[i - 1]) << node.name;
        }
        EXPECT_GT(node.forward_s[i], 0) << node.name;
        EXPECT_GT(node.backward_s[i], 0) << node.name;
      }
      for (double seconds : node.evaluate_s) EXPECT_GT(seconds, 0) << node.name;
      EXPECT_GT(node.step_s, 0) << node.name;
    }
    // The evaluation forward is timed at the held-out set's keys' rows: the embedding's one
    // visit over all of an evaluation key's parts.
    auto data = actors::load_job_data(config, &error);
    ASSERT_TRUE(data) << error;
    const auto& held_out = data->test.instances->instances;
    int64_t parts = 0;
    for (size_t i = 0; i < held_out.size() && i < actors::evaluation_batch; ++i)
      parts += held_out[i].parts();
    EXPECT_EQ(profile->nodes[0].evaluation_rows.back(), parts) << trees;
    EXPECT_EQ(profile->nodes[0].evaluation_rows.size(), profile->nodes[0].evaluate_s.size());
    // A loop or tree node is visited by groups of ready parts: its first row count is far below
    // the key's parts, which the embedding's one visit takes.
    EXPECT_LT(profile->nodes[1].rows.front(), profile->nodes[0].rows.back());
    EXPECT_GT(profile->loss_rows, 0);
    EXPECT_GT(profile->loss_s, 0);
    EXPECT_GT(profile->link_bandwidth, 0);
    auto reread = parse_profile(to_json_text(*profile), "profile", &error);
    ASSERT_TRUE(reread) << error;
    EXPECT_EQ(reread->nodes[1].forward_s, profile->nodes[1].forward_s);
    simulation_options options;
    options.profile = *profile;
    EXPECT_EQ(simulated(config, *data, ideal_cluster(2), options).summary.steps, 6) << trees;
  }
}

TEST(NodeTimingTest, AGraphsMeasuredPartitionCostsEachNodeOverItsKeysVisits) {
  const actors::job_config config = graph_job(true, 2, "async");
  std::string error;
  auto costs = measure_block_costs(config, 0.01, nullptr, &error);
  ASSERT_TRUE(costs) << error;
  ASSERT_EQ(costs->size(), 3u);  // one per node
  for (const actors::block_cost& cost : *costs) {
    EXPECT_GT(cost.forward, 0);
    EXPECT_GT(cost.backward, 0);
    EXPECT_GT(cost.step, 0);
  }
  // The tree node always computes its input gradient (its children's states need it).
  EXPECT_EQ((*costs)[1].input_gradient, 0);
  // A boundary's messages behind every node but the last.
  EXPECT_GT((*costs)[0].message, 0);
  EXPECT_GT((*costs)[1].message, 0);
  EXPECT_EQ((*costs)[2].message, 0);
  auto plan = actors::plan_partition(config, &*costs, &error);
  ASSERT_TRUE(plan) << error;
  EXPECT_EQ(plan->ranges.size(), 2u);
}

}  // namespace
}  // namespace troupe::sim
