// A small GPT through the pipeline state machines: sync mode (GPipe and 1F1B, several stage
// and micro-batch counts) and async mode with one active key train exactly as the sequential
// trainer does, as the MLP does (pipeline_test.cpp).

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "actors/config/job_data.h"
#include "actors/engine/partition.h"
#include "tests/support/job_helpers.h"
#include "tests/support/local_pipeline.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

/// Deterministic text of a few kilobytes, ASCII and some UTF-8, in a file of this process's
/// own (ctest runs each test in a process of its own, several at once), removed at exit.
class corpus_file {
 public:
  corpus_file()
      : path_(fs::temp_directory_path() /
              ("troupe_gpt_pipeline_corpus_" + std::to_string(::getpid()) + ".txt")) {
    std::ofstream out(path_);
    const char* words[] = {"the ",  "quick ", "brown ", "fox ",   "jumps ", "over ",
                           "lazy ", "dog. ",  "Größe ", "naïve ", "café\n"};
    uint64_t state = 7;
    for (int i = 0; i < 1500; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      out << words[(state >> 33) % 11];
    }
  }
  ~corpus_file() {
    std::error_code ignored;
    fs::remove(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

layers::layer_spec spec(const std::string& type) {
  layers::layer_spec s;
  s.type = type;
  return s;
}

job_config gpt_job(int stages, int micro_batches, pipeline_mode mode, pipeline_schedule schedule) {
  static const corpus_file corpus;
  job_config config;
  layers::layer_spec embedding = spec("embedding");
  embedding.vocab = 256;
  embedding.dim = 16;
  layers::layer_spec block = spec("transformer_block");
  block.heads = 2;
  block.dropout = 0.1f;
  layers::layer_spec head = spec("lm_head");
  head.vocab = 256;
  head.bias = false;
  config.model.layers = {embedding, block, block, block, spec("layernorm"), head};
  config.model.input_shape = {8};
  config.data.dataset = dataset_kind::text;
  config.data.path = corpus.path().string();
  config.data.context = 8;
  config.data.validation_fraction = 0.1;
  config.training.batch_size = 8;
  // Weights are compared under SGD: Adam turns float noise in gradients that are zero in
  // exact arithmetic (the key bias: softmax ignores a shift of a row's scores) into steps of
  // full size, so under Adam the losses are compared instead (AdamLossesEqualSequential).
  config.training.optimizer = layers::optimizer_kind::sgd;
  config.training.momentum = 0.9;
  config.training.lr = 0.05;
  config.training.weight_decay = 0.01;
  config.training.lr_schedule = lr_schedule_kind::cosine;
  config.training.warmup_steps = 5;
  config.parallelism.stages = stages;
  config.parallelism.micro_batches = micro_batches;
  config.parallelism.mode = mode;
  config.parallelism.schedule = schedule;
  config.parallelism.partition = "uniform";
  config.parallelism.min_update_interval = micro_batches;
  config.parallelism.max_active_keys = mode == pipeline_mode::async ? 1 : stages;
  return config;
}

/// Weights of every stage after `steps` steps, in the sequential trainer's parameter order.
testing::weights pipeline_weights(const job_config& config, const layers::dataset& data,
                                  int64_t steps, uint64_t order_seed) {
  std::string error;
  auto device = layers::create_backend("cpu", 1, &error);
  local_pipeline pipeline(config, *device, data.count(), steps, order_seed);
  pipeline.train(data, steps);
  testing::weights result;
  for (int s = 0; s < pipeline.stage_count(); ++s) {
    for (auto* p : pipeline.device_of(s).parameters()) {
      result.push_back(p->value.to_host(device->default_stream()));
    }
  }
  return result;
}

void expect_matches_sequential(const job_config& config, uint64_t order_seed = 0) {
  const int64_t steps = 12;
  std::string error;
  ASSERT_TRUE(check_model(config, 0, &error)) << error;
  auto data = load_job_data(config, &error);
  ASSERT_TRUE(data.has_value()) << error;
  const testing::weights expected = testing::sequential_weights(config, data->train, steps);
  const testing::weights actual = pipeline_weights(config, data->train, steps, order_seed);
  ASSERT_EQ(actual.size(), expected.size());
  // Micro-batches add weight gradients in another order (float reassociation).
  EXPECT_LE(testing::max_relative_difference(actual, expected), 2e-5)
      << to_string(config.parallelism.mode) << " " << to_string(config.parallelism.schedule)
      << " S=" << config.parallelism.stages << " M=" << config.parallelism.micro_batches;
}

TEST(GptPipelineTest, SyncGpipeEqualsSequential) {
  for (int stages : {1, 2, 3}) {
    for (int micro_batches : {1, 4}) {
      expect_matches_sequential(
          gpt_job(stages, micro_batches, pipeline_mode::sync, pipeline_schedule::gpipe));
    }
  }
}

TEST(GptPipelineTest, SyncOneForwardOneBackwardEqualsSequential) {
  expect_matches_sequential(gpt_job(3, 4, pipeline_mode::sync, pipeline_schedule::one_f_one_b));
  expect_matches_sequential(gpt_job(2, 8, pipeline_mode::sync, pipeline_schedule::one_f_one_b), 11);
}

TEST(GptPipelineTest, SyncGlobalClippingEqualsSequential) {
  // A bound below every step's norm: every step clips, by the norm of all stages together.
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
    job_config config = gpt_job(3, 4, pipeline_mode::sync, schedule);
    config.training.clip_norm = 0.05;
    expect_matches_sequential(config);
    expect_matches_sequential(config, 5);
  }
}

TEST(GptPipelineTest, PerStageClippingIsNotGlobalClipping) {
  // The control: async mode clips each stage by its own norm, which the sequential trainer's
  // global clipping does not reproduce, so the comparison above can tell them apart.
  job_config config = gpt_job(3, 1, pipeline_mode::async, pipeline_schedule::gpipe);
  config.training.clip_norm = 0.05;
  std::string error;
  auto data = load_job_data(config, &error);
  ASSERT_TRUE(data.has_value()) << error;
  EXPECT_GT(testing::max_relative_difference(pipeline_weights(config, data->train, 12, 0),
                                             testing::sequential_weights(config, data->train, 12)),
            1e-3);
}

TEST(GptPipelineTest, AsyncWithOneActiveKeyEqualsSequential) {
  expect_matches_sequential(gpt_job(3, 2, pipeline_mode::async, pipeline_schedule::gpipe));
}

/// Mean loss of each of `steps` steps: the pipeline's, and the sequential trainer's.
void expect_losses_match_sequential(const job_config& config, int64_t steps) {
  std::string error;
  auto data = load_job_data(config, &error);
  ASSERT_TRUE(data.has_value()) << error;
  const layers::dataset& train = data->train;
  auto device = layers::create_backend("cpu", 1, &error);
  local_pipeline pipeline(config, *device, train.count(), steps, 0);
  job_config whole = config;
  whole.parallelism.stages = 1;
  whole.parallelism.micro_batches = 1;
  sequential_trainer trainer(whole, *device);
  layers::batch_order order(train.count(), config.training.batch_size, config.training.seed,
                            config.data.shuffle, true);
  std::vector<float> features(config.training.batch_size * train.sample_size());
  std::vector<int32_t> labels(config.training.batch_size * train.labels_per_sample);
  for (int64_t step = 0; step < steps; ++step) {
    const pipeline_totals piped = pipeline.train(train, 1);
    order.gather(train, step, features.data(), labels.data());
    const double rate = learning_rate_at(config.training, step, order.batches_per_epoch(), steps);
    const batch_totals expected = trainer.train_step(features.data(), labels.data(),
                                                     config.training.batch_size, step, float(rate));
    ASSERT_EQ(piped.samples, expected.samples);
    EXPECT_NEAR(piped.loss_sum / piped.samples, expected.mean_loss(), 1e-5 * expected.mean_loss())
        << "step " << step << " S=" << config.parallelism.stages
        << " M=" << config.parallelism.micro_batches;
  }
}

TEST(GptPipelineTest, AdamWLossesEqualSequential) {
  for (pipeline_schedule schedule : {pipeline_schedule::gpipe, pipeline_schedule::one_f_one_b}) {
    job_config config = gpt_job(3, 4, pipeline_mode::sync, schedule);
    config.training.optimizer = layers::optimizer_kind::adamw;
    config.training.lr = 3e-3;
    config.training.weight_decay = 0.1;
    expect_losses_match_sequential(config, 12);
  }
}

TEST(GptPipelineTest, RecomputeTrainsTheSameWeightsInLessMemory) {
  job_config config = gpt_job(2, 4, pipeline_mode::sync, pipeline_schedule::gpipe);
  std::string error;
  auto data = load_job_data(config, &error);
  ASSERT_TRUE(data.has_value()) << error;
  std::vector<int64_t> peaks[2];
  testing::weights weights[2];
  for (int recompute = 0; recompute < 2; ++recompute) {
    config.parallelism.recompute = recompute == 1;
    auto device = layers::create_backend("cpu", 1, &error);
    local_pipeline pipeline(config, *device, data->train.count(), 6, 0);
    pipeline.train(data->train, 6);
    for (int s = 0; s < pipeline.stage_count(); ++s) {
      peaks[recompute].push_back(pipeline.device_of(s).peak_activation_bytes());
      for (auto* p : pipeline.device_of(s).parameters()) {
        weights[recompute].push_back(p->value.to_host(device->default_stream()));
      }
    }
  }
  EXPECT_EQ(weights[0], weights[1]) << "recomputation changes no number";
  // Stage 0 holds three blocks' activations for four keys; recomputing keeps their inputs.
  EXPECT_GT(peaks[0][0], 0);
  EXPECT_LT(peaks[1][0], peaks[0][0] * 2 / 3) << peaks[1][0] << " vs " << peaks[0][0];
}

TEST(GptPipelineTest, OneMicroBatchIsBitForBitTheSequentialTrainer) {
  const job_config config = gpt_job(3, 1, pipeline_mode::sync, pipeline_schedule::gpipe);
  std::string error;
  auto data = load_job_data(config, &error);
  ASSERT_TRUE(data.has_value()) << error;
  EXPECT_EQ(pipeline_weights(config, data->train, 6, 0),
            testing::sequential_weights(config, data->train, 6));
}

}  // namespace
}  // namespace troupe::actors
