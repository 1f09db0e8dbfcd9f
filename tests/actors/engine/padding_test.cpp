// data.padding = "longest": a key of sequences padded to its longest, as a framework without
// per-instance routes batches them. The padded positions are computed but not scored, and they
// come after each sequence's own: an LSTM's outputs at the real positions, and so every loss,
// gradient and evaluation, are those of the unpadded key.

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/run_reports.h"
#include "actors/engine/training_run.h"
#include "layers/backend_registry.h"
#include "layers/loss.h"
#include "layers/random.h"
#include "tests/support/job_helpers.h"
#include "tests/support/local_pipeline.h"

namespace troupe::actors {
namespace {

using testing::block;

/// embed → an LSTM cell looped over each sequence, every position emitted → head.
job_config lstm_job(padding_kind padding) {
  job_config config;
  layers::layer_spec embedding = block("embedding");
  embedding.vocab = 16;
  embedding.dim = 6;
  config.model.nodes = {
      testing::graph_node("embed", {embedding}, node_route::chain, node_emit::every, "cell"),
      testing::graph_node("cell", {block("lstm_cell", 8)}, node_route::loop, node_emit::every,
                          "head"),
      testing::graph_node("head", {block("linear", 16)}, node_route::chain, node_emit::every, "")};
  config.data.dataset = dataset_kind::text_records;
  config.data.padding = padding;
  config.training.batch_size = 8;
  config.training.epochs = 2;
  config.training.optimizer = layers::optimizer_kind::adam;
  config.training.lr = 0.02;
  config.training.seed = 3;
  config.parallelism.stages = 2;
  config.parallelism.micro_batches = 2;
  config.parallelism.partition = "uniform";
  config.metrics.log_interval = 1;
  return config;
}

/// Sequences of 1 to 12 tokens in [1, 16) from a random first one, each token the one after
/// the token before it (so there is something to learn), each labelled with the next.
layers::dataset sequences(int count, uint64_t seed) {
  auto data = std::make_shared<layers::instance_dataset>();
  data->vocabulary = data->classes = 16;
  layers::random_generator random(seed);
  for (int i = 0; i < count; ++i) {
    layers::instance& item = data->instances.emplace_back();
    const int length = 1 + static_cast<int>(random.below(12));
    item.tokens.push_back(1 + static_cast<int32_t>(random.below(15)));
    for (int t = 0; t < length; ++t) item.tokens.push_back(1 + item.tokens.back() % 15);
    item.labels.assign(item.tokens.begin() + 1, item.tokens.end());
    item.tokens.pop_back();
  }
  layers::dataset result;
  result.sample_shape = {1};
  result.instances = std::move(data);
  return result;
}

TEST(PaddingTest, AKeyIsPaddedToItsLongestWithUnscoredPositions) {
  std::string error;
  auto host = layers::create_backend("cpu", 1, &error);
  const layers::dataset data = sequences(6, 4);
  const std::vector<int64_t> samples{0, 1, 2, 3, 4, 5};
  const key_message plain = batch_message(key_kind::forward, 1, samples, data, *host);
  const key_message padded =
      batch_message(key_kind::forward, 1, samples, data, *host, padding_kind::longest);
  int64_t longest = 0, real = 0;
  for (int64_t sample : samples) {
    const layers::instance& item = data.instances->instances[static_cast<size_t>(sample)];
    longest = std::max(longest, item.parts());
    real += item.parts();
  }
  ASSERT_LT(real, 6 * longest);  // lengths differ, so something is padded
  EXPECT_EQ(plain.payload.dims(), (layers::shape{real, 1}));
  EXPECT_EQ(padded.payload.dims(), (layers::shape{6 * longest, 1}));
  EXPECT_EQ(static_cast<int64_t>(padded.labels->size()), 6 * longest);
  EXPECT_EQ(layers::counted_labels(*padded.labels), real);
  EXPECT_EQ(layers::counted_labels(*plain.labels), real);
  const std::vector<float> tokens = padded.payload.to_host(host->default_stream());
  for (size_t i = 0; i < samples.size(); ++i) {
    const layers::instance& original = data.instances->instances[i];
    const layers::instance& item = (*padded.instances)[i];
    ASSERT_EQ(item.parts(), longest);
    for (int64_t t = 0; t < longest; ++t) {
      const bool real_part = t < original.parts();
      const size_t at = static_cast<size_t>(t);
      EXPECT_EQ(item.tokens[at], real_part ? original.tokens[at] : 0);
      EXPECT_EQ(item.labels[at], real_part ? original.labels[at] : layers::ignored_label);
      EXPECT_EQ(tokens[static_cast<size_t>(static_cast<int64_t>(i) * longest + t)],
                static_cast<float>(item.tokens[at]));
    }
  }
}

struct finished_run {
  training_summary summary;
  std::vector<std::vector<float>> weights;
  std::vector<double> losses;
};

class fixed_clock final : public clock_source {
 public:
  double now_seconds() override { return now_ += 1.0; }

 private:
  double now_ = 0;
};

class loss_observer final : public training_observer {
 public:
  void on_step(int64_t, int64_t, int64_t, double, double) override {}
  void on_metrics(const metrics_record& record) override {
    if (!record.test_loss) losses.push_back(record.loss);
  }
  std::vector<double> losses;
};

finished_run train(const job_config& config, const job_data& data) {
  std::string error;
  auto device = layers::create_backend("cpu", 1, &error);
  local_pipeline pipeline(config, *device, data.train.count(),
                          planned_steps(config, data.train.count()), 0);
  fixed_clock clock;
  loss_observer observer;
  finished_run run;
  run.summary = pipeline.run(data, clock, observer);
  run.weights = pipeline.weights();
  run.losses = observer.losses;
  return run;
}

TEST(PaddingTest, PaddedKeysTrainAndEvaluateAsTheUnpaddedOnes) {
  const job_data data{sequences(48, 7), sequences(20, 8)};
  for (pipeline_mode mode : {pipeline_mode::sync, pipeline_mode::async}) {
    job_config config = lstm_job(padding_kind::none);
    config.parallelism.mode = mode;
    const finished_run plain = train(config, data);
    config.data.padding = padding_kind::longest;
    const finished_run padded = train(config, data);
    ASSERT_EQ(plain.summary.steps, 12);
    ASSERT_EQ(padded.losses.size(), plain.losses.size());
    for (size_t step = 0; step < plain.losses.size(); ++step)
      EXPECT_NEAR(padded.losses[step], plain.losses[step], 1e-5 * plain.losses[step]) << step;
    EXPECT_NEAR(padded.summary.final_test_loss, plain.summary.final_test_loss,
                1e-5 * plain.summary.final_test_loss);
    EXPECT_EQ(padded.summary.final_test_accuracy, plain.summary.final_test_accuracy);
    EXPECT_LE(testing::max_relative_difference(padded.weights, plain.weights), 1e-5);
    // The loss that trained is a learning one, not a constant both runs happen to share.
    EXPECT_LT(plain.losses.back(), plain.losses.front());
  }
}

}  // namespace
}  // namespace troupe::actors
