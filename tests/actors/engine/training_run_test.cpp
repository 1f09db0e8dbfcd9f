// A job run by the engine's coordinator (training_run) over its stage logic, in one thread with
// a fake clock: deterministic for a seed, it learns, and it reports what metrics.jsonl and
// summary.json promise. (The sequential oracle itself is a plain loop: testing::
// sequential_weights.)

#include <gtest/gtest.h>

#include <cmath>
#include <deque>

#include "actors/config/job_data.h"
#include "actors/engine/learning_rate.h"
#include "actors/engine/run_reports.h"
#include "actors/engine/sequential_trainer.h"
#include "actors/engine/training_run.h"
#include "layers/backend_registry.h"
#include "layers/gemm_precision.h"
#include "tests/support/job_helpers.h"
#include "tests/support/local_pipeline.h"

namespace troupe::actors {
namespace {

using testing::block;

job_config synthetic_job() {
  job_config config;
  config.model.input_shape = {16};
  layers::layer_spec dropout = block("dropout");
  dropout.probability = 0.1f;
  config.model.layers = {block("linear", 32), block("relu"), dropout, block("linear", 4)};
  config.data.dataset = dataset_kind::synthetic;
  config.data.synthetic_train = 1024;
  config.data.synthetic_test = 256;
  config.data.classes = 4;
  config.training.batch_size = 32;
  config.training.epochs = 3;
  config.training.lr = 0.05;
  config.training.momentum = 0.9;
  config.metrics.log_interval = 10;
  return config;
}

std::unique_ptr<layers::backend> cpu() {
  std::string error;
  return layers::create_backend("cpu", 1, &error);
}

/// A clock that advances one second per reading, so timings are exact.
class fake_clock final : public clock_source {
 public:
  double now_seconds() override { return now_ += 1.0; }

 private:
  double now_ = 0;
};

class recording_observer final : public training_observer {
 public:
  void on_step(int64_t step, int64_t, int64_t, double, double) override { last_step = step; }
  void on_metrics(const metrics_record& record) override { records.push_back(record); }

  int64_t last_step = 0;
  std::vector<metrics_record> records;
};

struct finished_run {
  training_summary summary;
  std::vector<std::vector<float>> weights;
  std::vector<metrics_record> records;
};

finished_run train(const job_config& config) {
  auto device = cpu();
  std::string error;
  auto data = load_job_data(config, &error);
  EXPECT_TRUE(data.has_value()) << error;
  fake_clock clock;
  recording_observer observer;
  finished_run run;
  local_pipeline pipeline(config, *device, data->train.count(),
                          planned_steps(config, data->train.count()), 0);
  run.summary = pipeline.run(*data, clock, observer);
  run.weights = pipeline.weights();
  run.records = observer.records;
  return run;
}

TEST(TrainingRunTest, SameSeedGivesIdenticalWeights) {
  job_config config = synthetic_job();
  finished_run first = train(config);
  finished_run second = train(config);
  EXPECT_EQ(first.weights, second.weights);
  config.training.seed = 2;
  EXPECT_NE(train(config).weights, first.weights);
}

TEST(TrainingRunTest, LearnsTheSyntheticTask) {
  finished_run run = train(synthetic_job());
  EXPECT_GT(run.summary.final_test_accuracy, 0.6);
  ASSERT_GE(run.records.size(), 2u);
  EXPECT_LT(run.records.back().loss, run.records.front().loss);
}

TEST(TrainingRunTest, LearnsAtReducedPrecision) {
  // GEMM operands rounded to tf32 or bf16 (weights kept in fp32) still learn the task as well
  // as fp32, and the weights show that the rounding really happened.
  const finished_run fp32 = train(synthetic_job());
  for (layers::math_precision precision :
       {layers::math_precision::tf32, layers::math_precision::bf16}) {
    job_config config = synthetic_job();
    config.training.precision = precision;
    finished_run run = train(config);
    EXPECT_GT(run.summary.final_test_accuracy, 0.6) << to_string(precision);
    ASSERT_GE(run.records.size(), 2u);
    EXPECT_LT(run.records.back().loss, 0.8 * run.records.front().loss) << to_string(precision);
    EXPECT_NE(run.weights, fp32.weights) << to_string(precision);
    EXPECT_EQ(train(config).weights, run.weights) << to_string(precision) << " is deterministic";
  }
}

TEST(TrainingRunTest, ReportsStepsEpochsAndEvaluations) {
  job_config config = synthetic_job();
  config.training.target_accuracy = 0.01;
  config.metrics.log_interval = 16;
  finished_run run = train(config);
  EXPECT_EQ(run.summary.steps, 3 * (1024 / 32));
  EXPECT_EQ(run.summary.epochs, 3);
  ASSERT_TRUE(run.summary.time_to_target_s.has_value());
  EXPECT_EQ(run.summary.steps_to_target, 32);  // the first evaluation, at the first epoch's end
  int evaluations = 0, logs = 0;
  for (const auto& record : run.records) {
    if (record.test_accuracy) {
      ++evaluations;
      EXPECT_EQ(record.step % 32, 0);
      EXPECT_EQ(record.epoch, evaluations);
      EXPECT_GT(record.samples_per_s, 0);
    } else {
      ++logs;
      EXPECT_EQ(record.step % 16, 0);
    }
  }
  EXPECT_EQ(evaluations, 3);
  EXPECT_EQ(logs, 3 * 32 / 16);
  EXPECT_GT(run.summary.samples_per_s, 0);
}

TEST(TrainingRunTest, ACheckpointsProgressKeepsWhenTheTargetWasReached) {
  run_progress progress;
  progress.step = 40;
  progress.time_to_target_s = 2.5;
  progress.steps_to_target = 32;
  std::string error;
  auto read = progress_from_json(to_json(progress), &error);
  ASSERT_TRUE(read) << error;
  EXPECT_EQ(read->time_to_target_s, 2.5);
  EXPECT_EQ(read->steps_to_target, 32);
  // A checkpoint written before the target was reached, or by an older build, has neither.
  nlohmann::json older = to_json(run_progress());
  older.erase("steps_to_target");
  read = progress_from_json(older, &error);
  ASSERT_TRUE(read) << error;
  EXPECT_FALSE(read->time_to_target_s || read->steps_to_target);
}

TEST(TrainingRunTest, EvaluatesWithinEpochsWithoutChangingTraining) {
  // Every 10 steps (of the run), 32-step epochs: evaluations at steps 10, 20, 30, 40, ...
  // besides each epoch's end. The pipeline drains at those step boundaries; sync training is
  // the same.
  job_config config = synthetic_job();
  config.parallelism.stages = 2;
  config.parallelism.micro_batches = 2;
  config.training.target_accuracy = 0.01;
  const finished_run plain = train(config);
  config.training.eval_interval_steps = 10;
  const finished_run frequent = train(config);
  EXPECT_EQ(frequent.weights, plain.weights);
  std::vector<int64_t> evaluated_at;
  for (const auto& record : frequent.records) {
    if (record.test_accuracy) evaluated_at.push_back(record.step);
  }
  EXPECT_EQ(evaluated_at, (std::vector<int64_t>{10, 20, 30, 32, 40, 50, 60, 64, 70, 80, 90, 96}));
  EXPECT_EQ(frequent.summary.epochs, 3);
  EXPECT_EQ(frequent.summary.final_test_accuracy, plain.summary.final_test_accuracy);
  ASSERT_TRUE(frequent.summary.time_to_target_s && plain.summary.time_to_target_s);
  EXPECT_LT(*frequent.summary.time_to_target_s, *plain.summary.time_to_target_s);
  EXPECT_EQ(frequent.summary.steps_to_target, 10);
  EXPECT_EQ(plain.summary.steps_to_target, 32);
}

TEST(TrainingRunTest, MaxStepsStopsEarly) {
  job_config config = synthetic_job();
  config.training.max_steps = 40;
  finished_run run = train(config);
  EXPECT_EQ(run.summary.steps, 40);
  EXPECT_EQ(run.summary.epochs, 2);
}

TEST(TrainingRunTest, AsyncCheckpointsWithSeveralMicroBatchesPauseAtAStepBoundary) {
  // MAK 3 and 4 keys per step: when a checkpoint falls due, the step under way may still lack
  // keys; admission must go on to the step's end before the pipeline can be quiet.
  job_config config = synthetic_job();
  config.parallelism.stages = 3;
  config.parallelism.mode = pipeline_mode::async;
  config.parallelism.micro_batches = 4;
  config.parallelism.min_update_interval = 4;
  config.parallelism.max_active_keys = 3;
  config.checkpoint.interval_steps = 3;
  config.training.epochs = 1;
  finished_run run = train(config);
  EXPECT_EQ(run.summary.steps, 1024 / 32);
}

/// The records of a run whose last stage reports loss 0.5 + step per sample; with
/// `retirement_first`, stage 0's retirement of every key reaches the coordinator before the
/// last stage's loss report for it, as it may when the two come by different connections.
std::vector<metrics_record> records_with_reports(bool retirement_first) {
  job_config config = synthetic_job();
  config.parallelism.stages = 2;
  config.parallelism.micro_batches = 2;
  config.training.epochs = 1;
  config.metrics.log_interval = 4;
  auto host = cpu();
  std::string error;
  auto data = load_job_data(config, &error);
  EXPECT_TRUE(data.has_value()) << error;
  recording_observer observer;
  training_run run(config, data->train, data->test, *host, observer);
  std::deque<key_message> to_send;
  double now = 0;
  for (auto& message : run.start(now)) to_send.push_back(message);
  while (!to_send.empty() && !run.finished()) {
    const key_message key = to_send.front();
    to_send.pop_front();
    const int64_t samples = key.payload.dims()[0];
    stage_output loss{stage_output::kind::loss_report, key};
    loss.message.payload = layers::tensor();
    loss.loss_sum = samples * (key.kind == key_kind::evaluate ? 0.25 : 0.5 + key.step);
    loss.correct = samples / 2;
    loss.samples = samples;
    stage_output retired{stage_output::kind::retired, key};
    retired.message.payload = layers::tensor();
    std::vector<stage_output> reports{loss};
    if (key.kind != key_kind::evaluate) {
      reports.insert(retirement_first ? reports.begin() : reports.end(), retired);
    }
    for (const stage_output& report : reports) {
      for (auto& message : run.handle(report, now += 1)) to_send.push_back(message);
    }
  }
  EXPECT_TRUE(run.finished());
  return observer.records;
}

TEST(TrainingRunTest, AStepIsLoggedWithItsOwnLossesWhicheverReportComesFirst) {
  const std::vector<metrics_record> in_order = records_with_reports(false);
  const std::vector<metrics_record> overtaken = records_with_reports(true);
  ASSERT_EQ(in_order.size(), 1024 / 32 / 4 + 1);
  ASSERT_EQ(overtaken.size(), in_order.size());
  for (size_t i = 0; i + 1 < in_order.size(); ++i) {
    // Steps 4i .. 4i+3: mean loss 0.5 + 4i + 1.5.
    EXPECT_EQ(in_order[i].step, 4 * static_cast<int64_t>(i + 1));
    EXPECT_DOUBLE_EQ(in_order[i].loss, 2.0 + 4.0 * i) << "record " << i;
    EXPECT_EQ(overtaken[i].step, in_order[i].step) << "record " << i;
    EXPECT_DOUBLE_EQ(overtaken[i].loss, in_order[i].loss) << "record " << i;
  }
  EXPECT_EQ(overtaken.back().test_loss, in_order.back().test_loss);
  EXPECT_DOUBLE_EQ(overtaken.back().loss, in_order.back().loss);  // the epoch's mean
}

TEST(LearningRateTest, SchedulesAndWarmup) {
  training_config training;
  training.lr = 0.1;
  EXPECT_DOUBLE_EQ(learning_rate_at(training, 50, 10, 100), 0.1);
  training.lr_schedule = lr_schedule_kind::cosine;
  EXPECT_DOUBLE_EQ(learning_rate_at(training, 0, 10, 100), 0.1);
  EXPECT_NEAR(learning_rate_at(training, 50, 10, 100), 0.05, 1e-12);
  EXPECT_NEAR(learning_rate_at(training, 100, 10, 100), 0.0, 1e-12);
  training.lr_schedule = lr_schedule_kind::step;
  training.lr_decay_epochs = 2;
  training.lr_decay = 0.5;
  EXPECT_DOUBLE_EQ(learning_rate_at(training, 19, 10, 100), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate_at(training, 20, 10, 100), 0.05);
  training.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate_at(training, 0, 10, 100), 0.025);
}

}  // namespace
}  // namespace troupe::actors
