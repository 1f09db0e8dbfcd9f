#pragma once

// The coordinator's side of a pipelined run as a state machine: it admits the keys of each
// epoch, sends evaluation keys through the pipeline after every epoch, and turns the stages'
// reports into metrics and the summary. Times are passed in and messages come out, so the
// real host and the simulator drive the same code.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "actors/coordinator_logic.h"
#include "actors/job_config.h"
#include "actors/pipeline_messages.h"
#include "actors/training_loop.h"
#include "layers/dataset.h"

namespace troupe::actors {

/// Evaluation keys are numbered from here, apart from training keys.
inline constexpr uint64_t first_evaluation_key = uint64_t(1) << 62;

class training_run {
 public:
  /// `host` holds the tensors of outgoing messages (a CPU backend: host memory). All
  /// references must outlive the run.
  training_run(const job_config& config, const layers::dataset& train, const layers::dataset& test,
               layers::backend& host, training_observer& observer);

  /// The first keys to send to stage 0.
  std::vector<key_message> start(double now_s);
  /// A report from the last stage (loss_report) or stage 0 (retired); returns what to send.
  std::vector<key_message> handle(const stage_output& report, double now_s);

  bool finished() const { return finished_; }
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
  key_message message_for(key_kind kind, uint64_t key, const std::vector<int64_t>& samples,
                          const layers::dataset& data);
  void emit_metrics(int64_t epoch, std::optional<batch_totals> test, double now_s);

  const job_config& config_;
  const layers::dataset& train_;
  const layers::dataset& test_;
  layers::backend& host_;
  training_observer& observer_;
  layers::batch_order order_;
  int64_t steps_per_epoch_;
  int64_t total_steps_;
  int64_t epoch_ = 0;
  std::unique_ptr<coordinator_logic> admission_;
  // Training figures since the last metrics line and over the current epoch.
  batch_totals interval_;
  batch_totals epoch_totals_;
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
  int64_t ignored_reports_ = 0;
};

}  // namespace troupe::actors
