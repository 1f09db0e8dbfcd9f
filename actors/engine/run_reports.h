#pragma once

// What every run reports and how: metrics records, the summary, the observer that receives them,
// and the injected clock their times come from. training_run (training_run.h) is the one
// driver that produces them, for the real hosts and the simulator alike.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "layers/dataset.h"

namespace troupe::actors {

/// Seconds from an arbitrary origin; the real host reads a monotonic clock, tests a fake.
class clock_source {
 public:
  virtual ~clock_source() = default;
  virtual double now_seconds() = 0;
};

/// One line of metrics.jsonl.
struct metrics_record {
  int64_t step = 0;   ///< optimizer steps taken so far
  int64_t epoch = 0;  ///< epochs completed (fractional progress is step / steps_per_epoch)
  double loss = 0;    ///< mean training loss since the previous record (evaluations: the epoch)
  double learning_rate = 0;
  double samples_per_s = 0;  ///< training samples per second over the same span
  double wall_s = 0;         ///< since the run started
  std::optional<double> test_accuracy;
  std::optional<double> test_loss;
  /// Language models: training tokens per second, and the held-out loss in bits per byte
  /// (byte tokens: the mean loss per token over ln 2).
  std::optional<double> tokens_per_s;
  std::optional<double> bits_per_byte;
};

struct training_summary {
  double final_test_accuracy = 0;
  double final_test_loss = 0;
  int64_t epochs = 0;
  int64_t steps = 0;
  double samples_per_s = 0;  ///< training samples over time spent training (not evaluating)
  double wall_s = 0;
  std::optional<double> time_to_target_s;
  /// Optimizer steps completed at that evaluation: the progress the target took, apart from
  /// the speed it was made at.
  std::optional<int64_t> steps_to_target;
  std::optional<double> tokens_per_s;   ///< language models (see metrics_record)
  std::optional<double> bits_per_byte;  ///< of the last evaluation
  /// Whether final_test_* come from an evaluation (this run's, or the resumed checkpoint's):
  /// a run stopped before its first has none to report.
  bool evaluated = false;
};

/// Receives what a run reports; called on the thread that runs the loop.
class training_observer {
 public:
  virtual ~training_observer() = default;
  /// After every step: for a progress bar.
  virtual void on_step(int64_t step, int64_t total_steps, int64_t epoch, double loss,
                       double samples_per_s) = 0;
  /// Every log_interval steps and after each epoch's evaluation.
  virtual void on_metrics(const metrics_record& record) = 0;
  /// A checkpoint written, a worker lost and recovered from, ...: an object with an "event"
  /// field, for metrics.jsonl.
  virtual void on_event(const nlohmann::json& event) { (void)event; }
};

/// Ignores everything a run reports: for runs whose summary alone counts.
class quiet_observer final : public training_observer {
 public:
  void on_step(int64_t, int64_t, int64_t, double, double) override {}
  void on_metrics(const metrics_record&) override {}
};

/// Total optimizer steps of a job on a training set of `train_samples` samples.
int64_t planned_steps(const job_config& config, int64_t train_samples);

/// The mean staleness of a histogram of backward passes by staleness (index: staleness);
/// nothing when it counts no pass.
std::optional<double> mean_staleness(const std::vector<int64_t>& histogram);

}  // namespace troupe::actors
