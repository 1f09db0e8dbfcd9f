// Dynamic models in the simulator: a graph job runs in virtual time with each key's route drawn
// from its own instances, a stage is charged the visits that route makes (a key of long
// sequences or deep trees costs more than one of short ones, by its visits), and numerics mode
// trains the graph exactly as the real sync pipeline does.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/engine/graph_program.h"
#include "actors/engine/training_run.h"
#include "actors/hosts/pipeline_host.h"
#include "sim/graph_cost.h"
#include "sim/shape_backend.h"
#include "sim/simulation.h"
#include "sim/stage_devices.h"
#include "tests/sim/simulation_fixtures.h"
#include "tests/support/engine_helpers.h"

namespace troupe::sim {
namespace {

/// A sequence of `length` tokens, each labelled with the next.
layers::instance sequence(int length, int first_token = 1) {
  layers::instance item;
  for (int t = 0; t < length; ++t) item.tokens.push_back((first_token + t) % 16);
  for (int t = 0; t < length; ++t) item.labels.push_back((first_token + t + 1) % 16);
  return item;
}

/// Sequences of the lengths given, in a training set of `copies` rounds of them and a test set
/// of one round.
actors::job_data sequences(const std::vector<int>& lengths, int copies) {
  auto instances = [&](int rounds) {
    auto data = std::make_shared<layers::instance_dataset>();
    data->vocabulary = data->classes = 16;
    for (int r = 0; r < rounds; ++r) {
      for (size_t i = 0; i < lengths.size(); ++i)
        data->instances.push_back(sequence(lengths[i], static_cast<int>(i + r)));
    }
    layers::dataset set;
    set.sample_shape = {1};
    set.instances = std::move(data);
    return set;
  };
  return {instances(copies), instances(1)};
}

actors::job_data loaded(const actors::job_config& config) {
  std::string error;
  auto data = actors::load_job_data(config, &error);
  EXPECT_TRUE(data) << error;
  return std::move(*data);
}

/// A measured cell whose visits cost 1 ms at one row and 2 ms at 9 rows (1/8 ms more per row),
/// and whose other passes cost nothing.
node_profile measured_cell() {
  node_profile cell;
  cell.name = "cell";
  cell.rows = {1, 9};
  cell.forward_s = {1e-3, 2e-3};
  cell.backward_s = {2e-3, 4e-3};
  cell.backward_first_s = cell.backward_s;
  cell.evaluate_s = cell.forward_s;
  return cell;
}

/// A profile of graph_job()'s nodes: the cell as measured_cell(), the rest free.
machine_profile graph_profile() {
  machine_profile profile;
  profile.batch = 8;
  profile.link_bandwidth = 1e18;
  for (const std::string name : {"embed", "cell", "head"}) {
    node_profile free_node;
    free_node.name = name;
    free_node.rows = {1};
    free_node.forward_s = free_node.backward_s = free_node.backward_first_s =
        free_node.evaluate_s = {0.0};
    profile.nodes.push_back(name == "cell" ? measured_cell() : free_node);
  }
  return profile;
}

TEST(GraphSimulationTest, AGraphJobRunsInVirtualTimeOnShapesAlone) {
  for (bool trees : {false, true}) {
    const actors::job_config config = graph_job(trees, 2, "async");
    const actors::job_data data = trees ? loaded(config) : sequences({3, 7, 12, 5}, 16);
    const simulation_result result = simulated(config, data, ideal_cluster(2));
    EXPECT_EQ(result.summary.steps, 6) << trees;
    EXPECT_GT(result.virtual_s, 0) << trees;
    for (double utilization : result.stage_utilization) EXPECT_GT(utilization, 0) << trees;
  }
  // Without numerics a stage computes nothing: its activations are shapes on the shape backend,
  // as many rows as the key's parts and as wide as the cell's state.
  const actors::job_config config = graph_job(false, 2, "async");
  std::string error;
  auto maker = stage_device_maker::make(config, std::nullopt, &error);
  ASSERT_TRUE(maker) << error;
  auto stage = maker->stage({0, 2}, device_model{}, nullptr);
  actors::key_message key;
  key.instances = std::make_shared<std::vector<layers::instance>>(
      std::vector<layers::instance>{sequence(4), sequence(2)});
  key.payload = layers::tensor(shape_backend(), {6, 1});
  ASSERT_TRUE(stage->accepts(key, &error)) << error;
  const layers::tensor output = stage->forward(key, true);
  EXPECT_EQ(&output.device(), &shape_backend());
  EXPECT_EQ(output.dims(), (layers::shape{6, 16}));  // the cell's [h | c] for every part
  key.instances.reset();
  EXPECT_FALSE(stage->accepts(key, &error));
}

TEST(GraphSimulationTest, AKeyIsChargedTheVisitsItsRouteMakes) {
  const actors::job_config config = graph_job(false, 1, "async");
  const machine_profile profile = graph_profile();
  std::string error;
  auto maker = stage_device_maker::make(config, profile, &error);
  ASSERT_TRUE(maker) << error;
  const auto graph = actors::ordered_graph_of(config, &error);
  ASSERT_TRUE(graph) << error;
  auto cost = graph_stage_cost::make(config, *graph, {0, 3}, device_model{}, &error);
  ASSERT_TRUE(cost) << error;
  cost->use_measured(profile.nodes, 0, 1);
  const auto visit_s = [](double rows) { return 1e-3 + (rows - 1) / 8 * 1e-3; };
  // Two sequences of 10: ten visits of two rows each.
  const std::vector<layers::instance> long_pair{sequence(10), sequence(10)};
  EXPECT_EQ(cost->visit_rows(1, long_pair), std::vector<int64_t>(10, 2));
  EXPECT_NEAR(cost->forward_s(long_pair, true), 10 * visit_s(2), 1e-12);
  // Lengths 3 and 10: three visits of both, then seven of the longer one alone.
  const std::vector<layers::instance> mixed{sequence(3), sequence(10)};
  EXPECT_NEAR(cost->forward_s(mixed, true), 3 * visit_s(2) + 7 * visit_s(1), 1e-12);
  // The same parts in one instance make thirteen visits of one row; split in two, seven at most.
  const std::vector<layers::instance> one_long{sequence(13)};
  EXPECT_NEAR(cost->forward_s(one_long, true), 13 * visit_s(1), 1e-12);
  EXPECT_GT(cost->forward_s(one_long, true), cost->forward_s({sequence(6), sequence(7)}, true));
  EXPECT_NEAR(cost->backward_s(mixed, false), 2 * (3 * visit_s(2) + 7 * visit_s(1)), 1e-12);
  // An evaluation forward is charged from the evaluation rows' own table.
  cost->use_measured(
      [&] {
        std::vector<node_profile> nodes = profile.nodes;
        nodes[1].evaluation_rows = {16, 32};
        nodes[1].evaluate_s = {4e-3, 6e-3};
        return nodes;
      }(),
      0, 1);
  // Below 16 rows: along the line through the two.
  const auto evaluation_s = [](double rows) { return 4e-3 + (rows - 16) * 2e-3 / 16; };
  EXPECT_NEAR(cost->forward_s(mixed, false), 3 * evaluation_s(2) + 7 * evaluation_s(1), 1e-12);
  EXPECT_NEAR(cost->forward_s(mixed, true), 3 * visit_s(2) + 7 * visit_s(1), 1e-12);
  // Beyond the measured rows the cost goes on along the last segment's line.
  EXPECT_NEAR(interpolated_s({1, 9}, {1e-3, 2e-3}, 17), 3e-3, 1e-12);

  // The stage's device is charged the same for a key of these instances.
  auto stage = maker->stage({0, 3}, device_model{}, nullptr);
  actors::key_message key;
  key.instances = std::make_shared<std::vector<layers::instance>>(mixed);
  key.payload = layers::tensor(shape_backend(), {13, 1});
  stage->take_charge();
  stage->forward(key, true);
  EXPECT_NEAR(stage->take_charge(), 3 * visit_s(2) + 7 * visit_s(1), 1e-12);
}

TEST(GraphSimulationTest, KeysOfLongerRoutesTakeLongerInTheSimulatedRun) {
  // Keys of 8 instances and 256 parts each: in one job every instance is 32 long (32 visits of
  // 8 rows per key), in the other one is 249 long and the rest 1 (249 visits, all but the first
  // of one row). The visits, not the parts, set the time.
  // Each key is the whole training set (shuffled or not).
  actors::job_config config = graph_job(false, 1, "async");
  config.training.epochs = 6;
  simulation_options options;
  options.profile = graph_profile();
  const std::vector<int> even(8, 32);
  const std::vector<int> uneven{249, 1, 1, 1, 1, 1, 1, 1};
  const double even_s = simulated(config, sequences(even, 1), ideal_cluster(1), options).virtual_s;
  const double uneven_s =
      simulated(config, sequences(uneven, 1), ideal_cluster(1), options).virtual_s;
  // Per key, 32 visits of 8 rows (1.875 ms each, 3.75 ms back) against one of 8 rows and 248 of
  // one (1 ms, 2 ms back).
  EXPECT_NEAR(uneven_s / even_s, (1.875 + 248) / (32 * 1.875), 0.05);
  // A tree's key makes as many visits as its deepest tree is high.
  const actors::job_config trees = graph_job(true, 1, "async");
  const actors::job_data data = loaded(trees);
  std::string error;
  const auto graph = actors::ordered_graph_of(trees, &error);
  ASSERT_TRUE(graph) << error;
  auto cost = graph_stage_cost::make(trees, *graph, {1, 2}, device_model{}, &error);
  ASSERT_TRUE(cost) << error;
  const std::vector<layers::instance> some(data.train.instances->instances.begin(),
                                           data.train.instances->instances.begin() + 8);
  const std::vector<int64_t> visits = cost->visit_rows(0, some);
  int64_t parts = 0;
  for (int64_t rows : visits) parts += rows;
  EXPECT_EQ(parts, actors::layout_of(some).parts());
  EXPECT_GT(visits.front(), visits.back());  // the leaves first, the roots last
}

TEST(GraphSimulationTest, NumericsTrainTheGraphAsTheRealSyncRunDoes) {
  for (bool trees : {false, true}) {
    const actors::job_config config = graph_job(trees, 2, "sync", 2);
    const actors::job_data data = trees ? loaded(config) : sequences({3, 7, 12, 5, 9, 1}, 8);
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
    std::string error;
    ASSERT_TRUE(actors::run_pipeline(config, data, real, clock, {}, &error)) << error;
    simulation_options options;
    options.numerics = true;
    auto result = simulate(config, data, ideal_cluster(2), options, predicted, &error);
    ASSERT_TRUE(result) << error;
    ASSERT_EQ(predicted.losses.size(), real.losses.size()) << trees;
    ASSERT_GE(real.losses.size(), 6u) << trees;
    for (size_t i = 0; i < real.losses.size(); ++i)
      EXPECT_EQ(predicted.losses[i], real.losses[i]) << (trees ? "trees" : "sequences") << " " << i;
    EXPECT_NE(real.losses.front(), real.losses[real.losses.size() - 2]) << trees;  // it trained
  }
}

TEST(GraphSimulationTest, AProfileMustTimeTheJobsNodes) {
  const actors::job_config config = graph_job(false, 1, "async");
  machine_profile profile = graph_profile();
  profile.nodes[1].name = "other";
  std::string error;
  EXPECT_FALSE(stage_device_maker::make(config, profile, &error));
  EXPECT_NE(error.find("the profile's node 1 is \"other\", the job's \"cell\""), std::string::npos)
      << error;
  profile.nodes.pop_back();
  EXPECT_FALSE(stage_device_maker::make(config, profile, &error));
  EXPECT_NE(error.find("times 2 graph nodes but the job's model has 3"), std::string::npos)
      << error;
  // A profile's node tables survive their JSON.
  auto reread = parse_profile(to_json_text(graph_profile()), "profile", &error);
  ASSERT_TRUE(reread) << error;
  ASSERT_EQ(reread->nodes.size(), 3u);
  EXPECT_EQ(reread->nodes[1].rows, (std::vector<int64_t>{1, 9}));
  EXPECT_EQ(reread->nodes[1].backward_s, measured_cell().backward_s);
  nlohmann::json text = nlohmann::json::parse(to_json_text(graph_profile()));
  text["nodes"][1]["rows"] = {9, 1};
  EXPECT_FALSE(parse_profile(text.dump(), "p.json", &error));
  EXPECT_NE(error.find("p.json: nodes[1].rows: must be increasing"), std::string::npos) << error;
}

}  // namespace
}  // namespace troupe::sim
