// The real host: stage actors and a coordinator actor exchanging ZeroMQ frames in one process
// train exactly like the sequential reference in sync mode, and keep async staleness bounded.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "actors/job_data.h"
#include "actors/learning_rate.h"
#include "actors/pipeline_host.h"
#include "actors/sequential_trainer.h"
#include "layers/backend_registry.h"

namespace troupe::actors {
namespace {

class wall_clock final : public clock_source {
 public:
  double now_seconds() override {
    using namespace std::chrono;
    return duration<double>(steady_clock::now().time_since_epoch()).count();
  }
};

class quiet_observer final : public training_observer {
 public:
  void on_step(int64_t, int64_t, int64_t, double, double) override {}
  void on_metrics(const metrics_record& record) override { records.push_back(record); }
  std::vector<metrics_record> records;
};

layers::layer_spec block(const std::string& type, int out = 0) {
  layers::layer_spec spec;
  spec.type = type;
  spec.out = out;
  return spec;
}

job_config host_job(int stages, int micro_batches, const std::string& mode,
                    const std::string& schedule) {
  job_config config;
  config.model.input_shape = {12};
  layers::layer_spec dropout = block("dropout");
  dropout.probability = 0.2f;
  config.model.layers = {block("linear", 24), block("tanh"),     dropout,
                         block("linear", 20), block("relu"),     block("linear", 16),
                         block("gelu"),       block("linear", 4)};
  config.data.dataset = "synthetic";
  config.data.synthetic_train = 800;
  config.data.synthetic_test = 100;
  config.data.classes = 4;
  config.training.batch_size = 16;
  config.training.epochs = 1;
  config.training.lr = 0.05;
  config.training.momentum = 0.9;
  config.training.lr_schedule = "cosine";
  config.parallelism.stages = stages;
  config.parallelism.micro_batches = micro_batches;
  config.parallelism.mode = mode;
  config.parallelism.schedule = schedule;
  config.parallelism.partition = "uniform";
  config.parallelism.threads = stages;
  config.metrics.log_interval = 10;
  return config;
}

using weights = std::vector<std::vector<float>>;

weights sequential_weights(job_config config, const layers::dataset& data) {
  config.parallelism.stages = 1;
  config.parallelism.micro_batches = 1;
  std::string error;
  auto device = layers::create_backend("cpu", 1, &error);
  sequential_trainer trainer(config, *device);
  layers::batch_order order(data.count(), config.training.batch_size, config.training.seed,
                            config.data.shuffle, true);
  order.start_epoch(0);
  const int64_t steps = order.batches_per_epoch();
  std::vector<float> features(config.training.batch_size * data.sample_size());
  std::vector<int32_t> labels(config.training.batch_size);
  for (int64_t step = 0; step < steps; ++step) {
    order.gather(data, step, features.data(), labels.data());
    trainer.train_step(features.data(), labels.data(), config.training.batch_size, step,
                       static_cast<float>(learning_rate_at(config.training, step, steps, steps)));
  }
  weights result;
  for (auto* p : trainer.model().parameters()) {
    result.push_back(p->value.to_host(trainer.work_stream()));
  }
  return result;
}

double max_relative_difference(const weights& a, const weights& b) {
  double worst = 0;
  for (size_t t = 0; t < b.size(); ++t) {
    double scale = 0, difference = 0;
    for (size_t i = 0; i < b[t].size(); ++i) {
      scale = std::max(scale, std::fabs(static_cast<double>(b[t][i])));
      difference = std::max(difference, std::fabs(static_cast<double>(a[t][i]) - b[t][i]));
    }
    worst = std::max(worst, difference / scale);
  }
  return worst;
}

pipeline_report run(const job_config& config, job_data* data_out = nullptr) {
  std::string error;
  auto data = load_job_data(config, &error);
  EXPECT_TRUE(data.has_value()) << error;
  wall_clock clock;
  quiet_observer observer;
  pipeline_options options;
  options.collect_weights = true;
  auto report = run_pipeline(config, *data, observer, clock, options, &error);
  EXPECT_TRUE(report.has_value()) << error;
  if (data_out) *data_out = *data;
  return *report;
}

weights all_weights(const pipeline_report& report) {
  weights result;
  for (const auto& stage : report.stages) {
    for (const auto& w : stage.weights) result.push_back(w);
  }
  return result;
}

TEST(PipelineHostTest, SyncStagesOverZeroMqEqualSequential) {
  for (const auto& [stages, micro, schedule] :
       {std::tuple{2, 4, "gpipe"}, std::tuple{4, 4, "1f1b"}, std::tuple{4, 2, "gpipe"}}) {
    job_config config = host_job(stages, micro, "sync", schedule);
    job_data data;
    pipeline_report report = run(config, &data);
    ASSERT_EQ(report.stages.size(), static_cast<size_t>(stages));
    EXPECT_LE(max_relative_difference(all_weights(report), sequential_weights(config, data.train)),
              1e-5)
        << schedule << " S=" << stages << " M=" << micro;
    EXPECT_EQ(report.summary.steps, 50);
    EXPECT_EQ(report.dropped_frames, 0u);
    for (const auto& stage : report.stages) EXPECT_EQ(stage.version, 50);
  }
}

TEST(PipelineHostTest, AsyncWithOneActiveKeyEqualsSequential) {
  job_config config = host_job(3, 2, "async", "gpipe");
  config.parallelism.max_active_keys = 1;
  job_data data;
  pipeline_report report = run(config, &data);
  EXPECT_LE(max_relative_difference(all_weights(report), sequential_weights(config, data.train)),
            1e-5);
}

TEST(PipelineHostTest, AsyncStalenessStaysWithinItsBoundAndTheRunEvaluates) {
  job_config config = host_job(4, 2, "async", "gpipe");
  config.parallelism.max_active_keys = 6;
  config.parallelism.min_update_interval = 2;
  config.training.epochs = 2;
  pipeline_report report = run(config);
  for (const auto& stage : report.stages) {
    EXPECT_LE(stage.staleness_histogram.size(), 1u + (6 - 1 + 2 - 1) / 2);
    EXPECT_LE(stage.peak_contexts, 6u);
  }
  EXPECT_EQ(report.summary.epochs, 2);
  EXPECT_GT(report.summary.final_test_accuracy, 0.5);
}

}  // namespace
}  // namespace troupe::actors
