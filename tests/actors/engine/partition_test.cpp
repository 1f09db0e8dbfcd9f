#include <gtest/gtest.h>

#include <algorithm>

#include "actors/engine/partition.h"
#include "tests/support/job_helpers.h"

namespace troupe::actors {
namespace {

using testing::block;

job_config mlp(int stages, const std::string& partition) {
  job_config config;
  config.model.input_shape = {784};
  config.model.layers = {block("linear", 1024), block("relu"), block("linear", 1024), block("relu"),
                         block("linear", 1024), block("relu"), block("linear", 10)};
  config.parallelism.stages = stages;
  config.parallelism.partition = partition;
  return config;
}

std::vector<std::pair<size_t, size_t>> pairs(const std::vector<stage_range>& ranges) {
  std::vector<std::pair<size_t, size_t>> result;
  for (const auto& r : ranges) result.push_back({r.first, r.last});
  return result;
}

TEST(PartitionTest, UniformSplitsBlockCounts) {
  std::string error;
  auto ranges = partition_model(mlp(2, "uniform"), &error);
  ASSERT_TRUE(ranges) << error;
  EXPECT_EQ(pairs(*ranges), (std::vector<std::pair<size_t, size_t>>{{0, 3}, {3, 7}}));
}

TEST(PartitionTest, BalancedEqualizesWorkAndCutsBeforeLinearLayers) {
  std::string error;
  auto ranges = partition_model(mlp(3, "balanced"), &error);
  ASSERT_TRUE(ranges) << error;
  // Three big linear layers: one per stage, each stage starting at a linear layer.
  EXPECT_EQ(pairs(*ranges), (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 4}, {4, 7}}));
}

TEST(PartitionTest, ExplicitCutPoints) {
  std::string error;
  auto ranges = partition_model(mlp(3, "2,6"), &error);
  ASSERT_TRUE(ranges) << error;
  EXPECT_EQ(pairs(*ranges), (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 6}, {6, 7}}));
  EXPECT_FALSE(partition_model(mlp(3, "6,2"), &error));
  EXPECT_NE(error.find("parallelism.partition"), std::string::npos) << error;
  EXPECT_FALSE(partition_model(mlp(3, "2"), &error));
  EXPECT_NE(error.find("2 cut points"), std::string::npos) << error;
}

TEST(PartitionTest, MoreStagesThanBlocksIsAnError) {
  std::string error;
  EXPECT_FALSE(partition_model(mlp(8, "balanced"), &error));
  EXPECT_NE(error.find("parallelism.stages = 8"), std::string::npos) << error;
  auto ranges = partition_model(mlp(7, "balanced"), &error);
  ASSERT_TRUE(ranges) << error;
  EXPECT_EQ(ranges->size(), 7u);
}

/// Blocks that cost `forward`, `backward` and `input_gradient` each, and nothing else; the
/// first, a parameterized block at the model's start, computes no input gradient.
std::vector<block_cost> costs_of(const std::vector<double>& forward,
                                 const std::vector<double>& backward,
                                 const std::vector<double>& input_gradient) {
  std::vector<block_cost> costs(forward.size());
  for (size_t i = 0; i < costs.size(); ++i) {
    costs[i].forward = forward[i];
    costs[i].backward = backward[i];
    costs[i].input_gradient = input_gradient[i];
  }
  costs[0].input_gradient_needed = false;
  return costs;
}

TEST(PartitionTest, BackwardWorkMovesTheCutAwayFromForwardBalance) {
  // Equal forward passes, but the first three blocks also have costly backward passes.
  const std::vector<double> forward{1, 1, 1, 1, 1, 1};
  const std::vector<double> none{0, 0, 0, 0, 0, 0};
  const std::vector<double> backward{1, 1, 1, 0, 0, 0};
  EXPECT_EQ(pairs(cheapest_ranges(costs_of(forward, none, none), 2)),
            (std::vector<std::pair<size_t, size_t>>{{0, 3}, {3, 6}}));
  // Forward and backward: 2, 3, 3, 1, 1, 1 (the first block computes no input gradient).
  const auto costs = costs_of(forward, backward, backward);
  EXPECT_EQ(pairs(cheapest_ranges(costs, 2)),
            (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 6}}));
  EXPECT_DOUBLE_EQ(stage_cost(costs, {0, 2}), 5);
  EXPECT_DOUBLE_EQ(stage_cost(costs, {2, 6}), 6);
}

TEST(PartitionTest, TheModelsFirstBlockComputesNoInputGradient) {
  // Counting its input gradient, block 0 alone would cost 12 and make a stage of its own.
  const auto costs = costs_of({1, 1, 1}, {1, 1, 1}, {10, 1, 1});
  EXPECT_DOUBLE_EQ(stage_cost(costs, {0, 1}), 2);
  EXPECT_DOUBLE_EQ(stage_cost(costs, {1, 2}), 3);
  EXPECT_EQ(pairs(cheapest_ranges(costs, 2)),
            (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 3}}));
}

TEST(PartitionTest, MessageCostsMoveTheCutToASmallerActivation) {
  auto costs = costs_of({1, 1, 1, 1}, {0, 0, 0, 0}, {0, 0, 0, 0});
  EXPECT_EQ(pairs(cheapest_ranges(costs, 2)),
            (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 4}}));
  // Block 1's output is large: a boundary behind it costs both of its stages 10.
  costs[0].message = 0.5;
  costs[1].message = 10;
  EXPECT_DOUBLE_EQ(stage_cost(costs, {0, 2}), 12);
  EXPECT_DOUBLE_EQ(stage_cost(costs, {1, 4}), 3.5);
  EXPECT_EQ(pairs(cheapest_ranges(costs, 2)),
            (std::vector<std::pair<size_t, size_t>>{{0, 3}, {3, 4}}));
}

TEST(PartitionTest, BalancedCountsTheBackwardPassOfTheFashionMlp) {
  std::string error;
  auto costs = estimated_block_costs(testing::fashion_mlp_job(2, "balanced"), &error);
  ASSERT_TRUE(costs) << error;
  // A hidden 1024x1024 layer: forward, weight and input gradient GEMMs of equal size.
  const block_cost& hidden = (*costs)[4];
  EXPECT_NEAR(hidden.backward / hidden.forward, 1.0, 0.02);
  EXPECT_NEAR(hidden.input_gradient / hidden.forward, 1.0, 0.02);
  // Every key steps (min_update_interval 1): 1M weights of memory traffic, a third of a GEMM.
  EXPECT_NEAR(hidden.step / hidden.forward, 0.3, 0.05);
  // The flatten and the first linear layer skip their input gradients: nothing before them
  // has parameters (layers::sequential computes none); the second linear layer computes one.
  EXPECT_FALSE((*costs)[1].input_gradient_needed);
  EXPECT_TRUE((*costs)[4].input_gradient_needed);
  EXPECT_DOUBLE_EQ(stage_cost(*costs, {0, 2}) - stage_cost(*costs, {0, 1}),
                   (*costs)[1].forward + (*costs)[1].backward + (*costs)[1].step +
                       (*costs)[1].message - (*costs)[0].message);
  EXPECT_DOUBLE_EQ(stage_cost(*costs, {0, 1}),
                   (*costs)[0].forward + (*costs)[0].backward + (*costs)[0].message);
}

TEST(PartitionTest, BalancedFashionMlpOnTwoStagesIsTheBestContiguousCut) {
  std::string error;
  const job_config config = testing::fashion_mlp_job(2, "balanced");
  auto plan = plan_partition(config, nullptr, &error);
  ASSERT_TRUE(plan) << error;
  // No single cut does better: whole layers cannot be split, so one stage holds two of the
  // three big linear layers. The cut falls between the second one and its activation.
  EXPECT_EQ(pairs(plan->ranges), (std::vector<std::pair<size_t, size_t>>{{0, 5}, {5, 11}}));
  auto costs = estimated_block_costs(config, &error);
  ASSERT_TRUE(costs);
  double best = 1;
  for (size_t cut = 1; cut < costs->size(); ++cut) {
    const double first = stage_cost(*costs, {0, cut}), second = stage_cost(*costs, {cut, 11});
    best = std::min(best, std::max(first, second) / (first + second));
  }
  EXPECT_DOUBLE_EQ(largest_share(*plan), best);
  EXPECT_LT(largest_share(*plan), 0.61);
  EXPECT_EQ(describe_plan(config, *plan).rfind("stages [0,5) [5,11); predicted share 5", 0), 0u)
      << describe_plan(config, *plan);
}

TEST(PartitionTest, MeasuredCostsChooseTheCutsAndPredictTheShares) {
  std::string error;
  job_config config = mlp(2, "measured");
  // The estimate cuts behind the second linear layer; measured, the last (small) layer is the
  // slow one.
  auto balanced = partition_model(config, &error);
  ASSERT_TRUE(balanced) << error;
  EXPECT_EQ(pairs(*balanced), (std::vector<std::pair<size_t, size_t>>{{0, 3}, {3, 7}}));
  std::vector<block_cost> measured(7);
  for (size_t i = 0; i < measured.size(); ++i) measured[i].forward = i == 6 ? 6 : 1;
  auto plan = plan_partition(config, &measured, &error);
  ASSERT_TRUE(plan) << error;
  EXPECT_EQ(pairs(plan->ranges), (std::vector<std::pair<size_t, size_t>>{{0, 6}, {6, 7}}));
  EXPECT_EQ(cut_points_text(plan->ranges), "6");
  EXPECT_EQ(describe_plan(config, *plan), "stages [0,6) [6,7); predicted share 50.0%, 50.0%");
  // Cut points keep their cuts and get the measured shares.
  config.parallelism.partition = "4";
  plan = plan_partition(config, &measured, &error);
  ASSERT_TRUE(plan) << error;
  EXPECT_EQ(describe_plan(config, *plan), "stages [0,4) [4,7); predicted share 33.3%, 66.7%");
  measured.pop_back();
  EXPECT_FALSE(plan_partition(config, &measured, &error));
  EXPECT_NE(error.find("6 measured block costs for the 7 blocks"), std::string::npos) << error;
}

}  // namespace
}  // namespace troupe::actors
