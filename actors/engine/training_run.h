#pragma once

// The coordinator's side of a pipelined run as a state machine: it admits the keys of each
// epoch, sends evaluation keys through the pipeline after every epoch, and turns the stages'
// reports into metrics and the summary. Times are passed in and messages come out, so the
// real host and the simulator drive the same code.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/admission.h"
#include "actors/engine/pipeline_messages.h"
#include "actors/engine/run_reports.h"
#include "actors/engine/sequential_trainer.h"
#include "layers/dataset.h"

namespace troupe::actors {

/// Evaluation keys are numbered from here, apart from training keys.
inline constexpr uint64_t first_evaluation_key = uint64_t(1) << 62;
/// Test samples per evaluation key (the last key of a test set may hold fewer).
inline constexpr int64_t evaluation_batch = 256;

/// Where a run stands: what a checkpoint records so that a later run continues from there.
struct run_progress {
  int64_t step = 0;   ///< optimizer steps completed: the data-loader cursor
  int64_t epoch = 0;  ///< epochs completed, evaluation included
  double wall_s = 0;  ///< run time so far
  double train_s = 0;
  int64_t train_samples = 0;
  std::optional<double> time_to_target_s;
  std::optional<int64_t> steps_to_target;
  double test_accuracy = 0;  ///< of the latest evaluation
  double test_loss = 0;
};

nlohmann::json to_json(const run_progress& progress);
/// Nothing, with `error` naming the field, when `json` is not a run_progress.
std::optional<run_progress> progress_from_json(const nlohmann::json& json, std::string* error);

/// The key message of `samples` of `data` (their features as the payload, on `host`, a CPU
/// backend, and their labels): what the coordinator assembles for every key it admits. A key
/// of sequence instances is padded as `padding` (data.padding) says.
key_message batch_message(key_kind kind, uint64_t key, const std::vector<int64_t>& samples,
                          const layers::dataset& data, layers::backend& host,
                          padding_kind padding = padding_kind::none);

class training_run {
 public:
  /// `host` holds the tensors of outgoing messages (a CPU backend: host memory). All
  /// references must outlive the run. With `resume`, the run continues from that point with
  /// the data order it would have had.
  training_run(const job_config& config, const layers::dataset& train, const layers::dataset& test,
               layers::backend& host, training_observer& observer,
               std::optional<run_progress> resume = std::nullopt);

  /// The first keys to send to stage 0.
  std::vector<key_message> start(double now_s);
  /// A report from the last stage (loss_report) or stage 0 (retired); returns what to send.
  std::vector<key_message> handle(const stage_output& report, double now_s);

  /// Asks for a checkpoint at the next step boundary: admission pauses there and the keys in
  /// flight drain; `stop_after` ends the run once it is written (preemption).
  void request_checkpoint(bool stop_after);
  /// The step of the checkpoint to take now: the pipeline is quiet (no key in flight) and
  /// waits for checkpoint_done(). Checkpoints come from request_checkpoint(), from
  /// [checkpoint] interval_steps / interval_s, and at the end of a run that has intervals.
  std::optional<int64_t> checkpoint_due() const { return due_step_; }
  /// The checkpoint is written (or failed and was reported): the run goes on.
  std::vector<key_message> checkpoint_done(double now_s);
  /// Where the run stands (at a checkpoint: the state the checkpoint records).
  run_progress progress(double now_s) const;

  bool finished() const { return finished_; }
  /// Training and evaluation keys sent into the pipeline and not yet back.
  int64_t keys_in_flight() const;
  /// Why the run cannot go on (the training loss stopped being finite); empty while it can.
  /// The run admits nothing more once this is set.
  const std::string& failure() const { return failure_; }
  /// The run ended early after a checkpoint asked with stop_after.
  bool stopped() const { return stopped_; }
  /// Reports that matched no key in flight (duplicates or forgeries), ignored.
  int64_t ignored_reports() const { return ignored_reports_; }
  const training_summary& summary() const { return summary_; }
  int64_t total_steps() const { return total_steps_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }

 private:
  std::vector<key_message> start_epoch(double now_s);
  std::vector<key_message> admit_training();
  std::vector<key_message> start_evaluation(double now_s);
  std::vector<key_message> handle_retired(uint64_t key, double now_s);
  std::vector<key_message> handle_evaluation(const stage_output& report, double now_s);
  key_message training_key(const admission& entry);
  /// A log record at `step`, or (without it) an evaluation record at the retired step.
  void emit_metrics(int64_t epoch, std::optional<batch_totals> test, double now_s,
                    std::optional<int64_t> step = std::nullopt);
  static batch_totals totals_of(const stage_output& report);
  /// The summary's final figures from the evaluation just finished.
  void keep_evaluation_figures();
  /// Optimizer steps whose keys have all retired (0 before the first is admitted).
  int64_t retired_steps() const;
  /// The evaluation just finished: the summary's test figures, the time to target, a record.
  void record_evaluation(double now_s);
  /// Logs the retired steps whose loss reports are all in, in order; `all_reported` logs
  /// every retired step with what came.
  void log_completed_steps(double now_s, bool all_reported);
  bool checkpoints_enabled() const;
  void note_step_for_checkpoint(int64_t step, double now_s);
  /// After an evaluation: the next epoch, a checkpoint first, or the end.
  std::vector<key_message> after_evaluation(double now_s);
  /// After an evaluation within an epoch (training.eval_interval_steps): training goes on,
  /// after a checkpoint when one is due.
  std::vector<key_message> after_evaluation_within_epoch(double now_s);
  void finish(double now_s);

  const job_config& config_;
  /// Batch totals count labels: one per sample, or one per token of a language model.
  int64_t tokens_per_sample() const { return train_.labels_per_sample; }
  bool language_model() const { return config_.data.dataset == dataset_kind::text; }
  double samples_of(const batch_totals& totals) const {
    return static_cast<double>(totals.samples) / static_cast<double>(tokens_per_sample());
  }

  const layers::dataset& train_;
  const layers::dataset& test_;
  layers::backend& host_;
  training_observer& observer_;
  layers::batch_order order_;
  int64_t steps_per_epoch_;
  int64_t total_steps_;
  int64_t epoch_ = 0;
  std::unique_ptr<admission_policy> admission_;
  // Training figures since the last metrics line and over the current epoch.
  batch_totals interval_;
  batch_totals epoch_totals_;
  // Loss reports by step, until the step is retired and logged: the last stage's reports and
  // stage 0's retirements reach the coordinator by different connections, in either order.
  struct step_losses {
    batch_totals totals;
    int64_t reports = 0;
  };
  std::map<int64_t, step_losses> step_losses_;
  std::deque<int64_t> unlogged_steps_;  ///< retired step counts not logged yet
  int64_t next_logged_step_ = 0;
  double interval_train_s_ = 0;
  double epoch_start_s_ = 0;
  double train_s_ = 0;
  int64_t train_samples_ = 0;
  double start_s_ = 0;
  double last_log_s_ = 0;
  // Evaluation in progress.
  batch_totals evaluation_;
  int64_t evaluation_batches_ = 0;
  int64_t evaluation_reports_ = 0;
  training_summary summary_;
  bool finished_ = false;
  bool stopped_ = false;
  std::string failure_;
  int64_t ignored_reports_ = 0;
  // Checkpoints and resuming.
  std::optional<run_progress> resume_;
  double elapsed_before_s_ = 0;  ///< run time of the parts before a resume
  bool checkpoint_requested_ = false;
  // Evaluations within an epoch (training.eval_interval_steps).
  bool evaluation_requested_ = false;
  bool evaluating_within_epoch_ = false;
  double evaluation_start_s_ = 0;
  bool stop_after_checkpoint_ = false;
  bool paused_ = false;
  std::optional<int64_t> due_step_;
  enum class after_checkpoint { admit, start_epoch, finish } after_ = after_checkpoint::admit;
  double last_checkpoint_s_ = 0;
  bool evaluation_only_ = false;
};

}  // namespace troupe::actors
