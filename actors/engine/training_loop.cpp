#include "actors/engine/training_loop.h"

#include <algorithm>
#include <vector>

#include "actors/engine/learning_rate.h"

namespace troupe::actors {

int64_t planned_steps(const job_config& config, int64_t train_samples) {
  const int64_t per_epoch = train_samples / config.training.batch_size;
  int64_t steps = per_epoch * config.training.epochs;
  if (config.training.max_steps > 0) steps = std::min(steps, config.training.max_steps);
  return steps;
}

namespace {

/// Accumulates loss and time between two metrics records.
struct interval {
  double loss_sum = 0;
  int64_t samples = 0;
  double train_seconds = 0;

  void reset() { *this = interval(); }
};

class loop {
 public:
  loop(const job_config& config, sequential_trainer& trainer, const layers::dataset& train,
       const layers::dataset& test, clock_source& clock, training_observer& observer)
      : config_(config),
        trainer_(trainer),
        train_(train),
        test_(test),
        clock_(clock),
        observer_(observer),
        order_(train.count(), config.training.batch_size, config.training.seed, config.data.shuffle,
               true) {}

  training_summary run() {
    start_ = clock_.now_seconds();
    const int64_t total = planned_steps(config_, train_.count());
    const int64_t per_epoch = order_.batches_per_epoch();
    for (int64_t epoch = 0; step_ < total; ++epoch) {
      order_.start_epoch(epoch);
      for (int64_t b = 0; b < per_epoch && step_ < total; ++b) run_step(b, epoch, total);
      summary_.epochs = epoch + 1;
      evaluate(epoch + 1);
    }
    finish();
    return summary_;
  }

 private:
  void run_step(int64_t batch, int64_t epoch, int64_t total) {
    const double before = clock_.now_seconds();
    const int64_t samples = config_.training.batch_size;
    features_.resize(samples * train_.sample_size());
    labels_.resize(samples);
    order_.gather(train_, batch, features_.data(), labels_.data());
    learning_rate_ = learning_rate_at(config_.training, step_, order_.batches_per_epoch(), total);
    batch_totals totals = trainer_.train_step(features_.data(), labels_.data(), samples, step_,
                                              static_cast<float>(learning_rate_));
    const double seconds = clock_.now_seconds() - before;
    ++step_;
    record(totals, seconds);
    observer_.on_step(step_, total, epoch, totals.mean_loss(),
                      seconds > 0 ? samples / seconds : 0.0);
    if (config_.metrics.log_interval > 0 && step_ % config_.metrics.log_interval == 0) {
      emit(epoch, std::nullopt);
    }
  }

  void record(const batch_totals& totals, double seconds) {
    for (interval* each : {&interval_, &epoch_}) {
      each->loss_sum += totals.loss_sum;
      each->samples += totals.samples;
      each->train_seconds += seconds;
    }
    train_samples_ += totals.samples;
    train_seconds_ += seconds;
  }

  void evaluate(int64_t epochs_done) {
    batch_totals totals =
        trainer_.evaluate(test_, std::max<int64_t>(config_.training.batch_size, 256));
    summary_.final_test_accuracy = totals.accuracy();
    summary_.final_test_loss = totals.mean_loss();
    const double target = config_.training.target_accuracy;
    if (target > 0 && !summary_.time_to_target_s && totals.accuracy() >= target) {
      summary_.time_to_target_s = clock_.now_seconds() - start_;
    }
    emit(epochs_done, totals);
    epoch_.reset();
  }

  /// A log-interval record covers the steps since the previous one; an evaluation record
  /// covers the whole epoch.
  void emit(int64_t epoch, std::optional<batch_totals> test) {
    const interval& span = test ? epoch_ : interval_;
    metrics_record record;
    record.step = step_;
    record.epoch = epoch;
    record.loss = span.samples ? span.loss_sum / span.samples : 0.0;
    record.learning_rate = learning_rate_;
    record.samples_per_s = span.train_seconds > 0 ? span.samples / span.train_seconds : 0.0;
    record.wall_s = clock_.now_seconds() - start_;
    if (test) {
      record.test_accuracy = test->accuracy();
      record.test_loss = test->mean_loss();
    }
    observer_.on_metrics(record);
    interval_.reset();
  }

  void finish() {
    summary_.steps = step_;
    summary_.wall_s = clock_.now_seconds() - start_;
    summary_.samples_per_s = train_seconds_ > 0 ? train_samples_ / train_seconds_ : 0.0;
  }

  const job_config& config_;
  sequential_trainer& trainer_;
  const layers::dataset& train_;
  const layers::dataset& test_;
  clock_source& clock_;
  training_observer& observer_;
  layers::batch_order order_;
  std::vector<float> features_;
  std::vector<int32_t> labels_;
  interval interval_;
  interval epoch_;
  training_summary summary_;
  int64_t step_ = 0;
  int64_t train_samples_ = 0;
  double train_seconds_ = 0;
  double learning_rate_ = 0;
  double start_ = 0;
};

}  // namespace

training_summary run_training(const job_config& config, sequential_trainer& trainer,
                              const layers::dataset& train, const layers::dataset& test,
                              clock_source& clock, training_observer& observer) {
  return loop(config, trainer, train, test, clock, observer).run();
}

}  // namespace troupe::actors
