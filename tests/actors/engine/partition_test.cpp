#include <gtest/gtest.h>

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

}  // namespace
}  // namespace troupe::actors
