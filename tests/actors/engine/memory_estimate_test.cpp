// What a job needs in memory, from its shapes: the figures of a small model worked by hand,
// and the check that refuses a job its machine cannot hold (machine memory given by the test).

#include <gtest/gtest.h>

#include <string>

#include "actors/engine/memory_estimate.h"
#include "tests/support/job_helpers.h"

namespace troupe::actors {
namespace {

/// An 8-16-4 MLP on synthetic [8] samples: 8·16 + 16 + 16·4 + 4 = 212 parameters; a sample's
/// forward keeps 16 + 16 + 4 floats (each block's output).
job_config small_mlp() {
  job_config config;
  config.model.input_shape = {8};
  config.model.layers = {testing::block("linear", 16), testing::block("relu"),
                         testing::block("linear", 4)};
  config.data.dataset = dataset_kind::synthetic;
  config.data.synthetic_train = 100;
  config.data.synthetic_test = 28;
  config.data.classes = 4;
  config.training.batch_size = 16;
  config.training.momentum = 0.9;  // one velocity per parameter
  config.parallelism.micro_batches = 2;
  return config;
}

/// A convolution of 16 channels over [3, 20000, 20000] images, pooled down to 10 classes: few
/// parameters, but per sample it keeps its unfolded input, 3 · 3² · 4·10⁸ floats (43.2 GB), and
/// the relu its output, 16 · 4·10⁸ floats (25.6 GB).
job_config wide_convolution() {
  job_config config;
  config.model.input_shape = {3, 20000, 20000};
  layers::layer_spec convolution = testing::block("conv2d", 16);
  convolution.kernel = 3;
  convolution.padding = 1;
  layers::layer_spec pooling = testing::block("maxpool2d");
  pooling.kernel = 1000;
  config.model.layers = {convolution, testing::block("relu"), pooling, testing::block("flatten"),
                         testing::block("linear", 10)};
  config.data.dataset = dataset_kind::synthetic;
  config.data.synthetic_train = 4;
  config.data.synthetic_test = 4;
  config.training.batch_size = 4;
  return config;
}

std::string refusal(const job_config& config, double available_bytes) {
  std::string error;
  EXPECT_FALSE(check_memory(config, available_bytes, &error));
  return error;
}

TEST(MemoryEstimateTest, CountsStateActivationsOfOneKeyAndTheSyntheticData) {
  std::string error;
  const auto estimate = estimate_memory(small_mlp(), &error);
  ASSERT_TRUE(estimate) << error;
  EXPECT_EQ(estimate->state_bytes, 4.0 * 212 * 3);  // weights, gradients, velocities
  EXPECT_EQ(estimate->key_samples, 8);              // 16 samples in 2 micro-batches
  EXPECT_EQ(estimate->key_bytes, 4.0 * 36 * 8);     // 36 floats per sample kept
  EXPECT_EQ(estimate->data_bytes, 4.0 * 8 * 128);   // 100 + 28 samples of 8 floats
  EXPECT_EQ(estimate->total_bytes(), 2544.0 + 1152 + 4096);

  job_config adam = small_mlp();
  adam.training.optimizer = layers::optimizer_kind::adam;  // two moments per parameter
  adam.parallelism.replicas = 2;  // two copies, each with a key of 4 samples
  const auto replicated = estimate_memory(adam, &error);
  ASSERT_TRUE(replicated) << error;
  EXPECT_EQ(replicated->state_bytes, 2 * 4.0 * 212 * 4);
  EXPECT_EQ(replicated->key_samples, 4);
  EXPECT_EQ(replicated->key_bytes, 2 * 4.0 * 36 * 4);
}

TEST(MemoryEstimateTest, AJobFitsUpToTheMachinesMemoryAndNotAByteBeyond) {
  const double needed = 2544.0 + 1152 + 4096;
  std::string error;
  EXPECT_TRUE(check_memory(small_mlp(), needed, &error)) << error;
  const std::string refused = refusal(small_mlp(), needed - 1);
  EXPECT_NE(refused.find("needs at least 0.0 GB"), std::string::npos) << refused;
  // The data set is the largest part here: its keys are the ones to change.
  EXPECT_NE(refused.find("data.synthetic_train"), std::string::npos) << refused;
}

TEST(MemoryEstimateTest, AKeyOfHundredsOfGigabytesIsRefusedNamingTheKeysToChange) {
  std::string error;
  const auto estimate = estimate_memory(wide_convolution(), &error);
  ASSERT_TRUE(estimate) << error;
  // 68.8 GB per sample, 4 samples per key.
  EXPECT_GE(estimate->key_bytes, 100e9);
  EXPECT_EQ(estimate->key_bytes, 4 * 4 * (27 * 4e8 + 16 * 4e8 + 16 * 20 * 20 * 2 + 10.0));
  const std::string refused = refusal(wide_convolution(), 64e9);
  EXPECT_NE(refused.find("275.2 GB of activations for one key of 4 samples"), std::string::npos)
      << refused;
  EXPECT_NE(refused.find("this machine has 64.0 GB available"), std::string::npos) << refused;
  EXPECT_NE(refused.find("training.batch_size"), std::string::npos) << refused;
  EXPECT_NE(refused.find("model.input_shape"), std::string::npos) << refused;

  // On GPUs the stages' memory is the devices': only the data (38.4 GB) counts here.
  job_config on_gpu = wide_convolution();
  on_gpu.parallelism.devices = {"cuda:0"};
  EXPECT_TRUE(check_memory(on_gpu, 64e9, &error)) << error;
  EXPECT_FALSE(check_memory(on_gpu, 30e9, &error));
  EXPECT_NE(error.find("data.synthetic_train"), std::string::npos) << error;
}

TEST(MemoryEstimateTest, AModelWhoseShapesDoNotChainIsRefusedNamingTheBlock) {
  job_config config = small_mlp();
  config.model.layers.front().type = "conv2d";  // needs [channels, height, width]
  std::string error;
  EXPECT_FALSE(estimate_memory(config, &error));
  EXPECT_NE(error.find("model.layers[0]"), std::string::npos) << error;
}

}  // namespace
}  // namespace troupe::actors
