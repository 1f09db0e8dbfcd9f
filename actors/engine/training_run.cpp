#include "actors/engine/training_run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "actors/engine/learning_rate.h"
#include "actors/engine/stage_settings.h"
#include "layers/check.h"

namespace troupe::actors {

nlohmann::json to_json(const run_progress& progress) {
  nlohmann::json json = {{"step", progress.step},
                         {"epoch", progress.epoch},
                         {"wall_s", progress.wall_s},
                         {"train_s", progress.train_s},
                         {"train_samples", progress.train_samples},
                         {"test_accuracy", progress.test_accuracy},
                         {"test_loss", progress.test_loss}};
  json["time_to_target_s"] =
      progress.time_to_target_s ? nlohmann::json(*progress.time_to_target_s) : nlohmann::json();
  json["steps_to_target"] =
      progress.steps_to_target ? nlohmann::json(*progress.steps_to_target) : nlohmann::json();
  return json;
}

std::optional<run_progress> progress_from_json(const nlohmann::json& json, std::string* error) {
  run_progress progress;
  if (!json.is_object()) {
    *error = "the coordinator's progress is not an object";
    return std::nullopt;
  }
  auto integer = [&](const char* name, int64_t* into) {
    auto found = json.find(name);
    if (found == json.end() || !found->is_number_integer() || found->get<int64_t>() < 0) {
      *error = std::string("coordinator.") + name + " is missing or not a non-negative integer";
      return false;
    }
    *into = found->get<int64_t>();
    return true;
  };
  auto number = [&](const char* name, double* into) {
    auto found = json.find(name);
    if (found == json.end() || !found->is_number()) {
      *error = std::string("coordinator.") + name + " is missing or not a number";
      return false;
    }
    *into = found->get<double>();
    return true;
  };
  if (!integer("step", &progress.step) || !integer("epoch", &progress.epoch) ||
      !integer("train_samples", &progress.train_samples) || !number("wall_s", &progress.wall_s) ||
      !number("train_s", &progress.train_s) || !number("test_accuracy", &progress.test_accuracy) ||
      !number("test_loss", &progress.test_loss)) {
    return std::nullopt;
  }
  auto target = json.find("time_to_target_s");
  if (target != json.end() && target->is_number())
    progress.time_to_target_s = target->get<double>();
  auto target_step = json.find("steps_to_target");
  if (target_step != json.end() && target_step->is_number_integer() &&
      target_step->get<int64_t>() >= 0) {
    progress.steps_to_target = target_step->get<int64_t>();
  }
  return progress;
}

namespace {

/// data.padding = "longest": each sequence of a key lengthened to the key's longest, as a
/// padded batch is, with token 0 (a byte that UTF-8 text never holds) labelled ignored_label,
/// so that the added positions are computed like real ones but scored by no loss. The padding
/// comes after each sequence's own positions: a causal model's outputs there are unchanged.
void pad_to_longest(std::vector<layers::instance>* instances) {
  int64_t longest = 0;
  for (const layers::instance& item : *instances) longest = std::max(longest, item.parts());
  for (layers::instance& item : *instances) {
    TROUPE_CHECK(item.is_sequence() && item.labels.size() == item.tokens.size());
    item.tokens.resize(static_cast<size_t>(longest), 0);
    item.labels.resize(static_cast<size_t>(longest), layers::ignored_label);
  }
}

/// The key of instances `samples` of a dynamic model's data: their parts' token ids as the
/// payload rows, their labels in row order (one per instance, or one per part).
key_message instance_message(key_kind kind, uint64_t key, const std::vector<int64_t>& samples,
                             const layers::instance_dataset& data, layers::backend& host,
                             padding_kind padding) {
  auto instances = std::make_shared<std::vector<layers::instance>>();
  for (int64_t sample : samples) instances->push_back(data.instances[static_cast<size_t>(sample)]);
  if (padding == padding_kind::longest) pad_to_longest(instances.get());
  auto labels = std::make_shared<std::vector<int32_t>>();
  std::vector<float> tokens;
  for (const layers::instance& item : *instances) {
    tokens.insert(tokens.end(), item.tokens.begin(), item.tokens.end());
    labels->insert(labels->end(), item.labels.begin(), item.labels.end());
  }
  key_message message;
  message.kind = kind;
  message.key = key;
  message.payload = layers::tensor::from_host(host, host.default_stream(),
                                              {static_cast<int64_t>(tokens.size()), 1}, tokens);
  message.labels = std::move(labels);
  message.instances = std::move(instances);
  return message;
}

}  // namespace

key_message batch_message(key_kind kind, uint64_t key, const std::vector<int64_t>& samples,
                          const layers::dataset& data, layers::backend& host,
                          padding_kind padding) {
  if (data.instances) return instance_message(kind, key, samples, *data.instances, host, padding);
  const int64_t size = data.sample_size();
  const int64_t count = static_cast<int64_t>(samples.size());
  layers::shape dims{count};
  dims.insert(dims.end(), data.sample_shape.begin(), data.sample_shape.end());
  key_message message;
  message.kind = kind;
  message.key = key;
  message.payload = layers::tensor(host, dims);
  const int64_t per_sample = data.labels_per_sample;
  auto labels = std::make_shared<std::vector<int32_t>>(count * per_sample);
  // Each sample's row goes straight into the payload: a batch assembled in a buffer of its own
  // cost a fresh, zeroed allocation and a second copy on the critical path between steps.
  const layers::stream stream = host.default_stream();
  const size_t row_bytes = static_cast<size_t>(size) * sizeof(float);
  for (int64_t i = 0; i < count; ++i) {
    host.copy_host_to_device(stream, message.payload.data() + i * size,
                             data.features.data() + samples[i] * size, row_bytes);
    std::copy_n(data.labels.begin() + samples[i] * per_sample, per_sample,
                labels->begin() + i * per_sample);
  }
  host.synchronize(stream);
  message.labels = labels;
  return message;
}

training_run::training_run(const job_config& config, const layers::dataset& train,
                           const layers::dataset& test, layers::backend& host,
                           training_observer& observer, std::optional<run_progress> resume)
    : config_(config),
      train_(train),
      test_(test),
      host_(host),
      observer_(observer),
      order_(train.count(), config.training.batch_size, config.training.seed, config.data.shuffle,
             true),
      steps_per_epoch_(order_.batches_per_epoch()),
      total_steps_(planned_steps(config, train.count())),
      resume_(std::move(resume)) {
  if (resume_) {
    epoch_ = resume_->step / steps_per_epoch_;
    elapsed_before_s_ = resume_->wall_s;
    train_s_ = resume_->train_s;
    train_samples_ = resume_->train_samples;
    summary_.epochs = epoch_;
    summary_.time_to_target_s = resume_->time_to_target_s;
    summary_.steps_to_target = resume_->steps_to_target;
    summary_.final_test_accuracy = resume_->test_accuracy;
    summary_.final_test_loss = resume_->test_loss;
    summary_.evaluated = resume_->test_loss > 0;
  }
}

std::vector<key_message> training_run::start(double now_s) {
  start_s_ = now_s - elapsed_before_s_;
  last_checkpoint_s_ = now_s;
  if (total_steps_ == 0) {
    // Nothing to train (epochs = 0): the run only evaluates its initial weights.
    evaluation_only_ = true;
    return start_evaluation(now_s);
  }
  if (resume_ && resume_->step >= total_steps_) {
    finish(now_s);
    return {};
  }
  return start_epoch(now_s);
}

std::vector<key_message> training_run::start_epoch(double now_s) {
  order_.start_epoch(epoch_);
  admission_settings settings = admission_settings::of(config_, total_steps_);
  settings.first_step = epoch_ * steps_per_epoch_;
  if (resume_) {
    settings.first_step = std::max(settings.first_step, resume_->step);
    resume_.reset();
  }
  settings.total_steps = std::min(total_steps_, (epoch_ + 1) * steps_per_epoch_);
  admission_ = std::make_unique<admission_policy>(settings);
  epoch_start_s_ = now_s;
  last_log_s_ = now_s;
  epoch_totals_ = batch_totals();
  next_logged_step_ = settings.first_step;
  return admit_training();
}

std::vector<key_message> training_run::admit_training() {
  std::vector<key_message> messages;
  for (const admission& entry : admission_->admit()) messages.push_back(training_key(entry));
  return messages;
}

key_message training_run::training_key(const admission& entry) {
  const int64_t micro = micro_batch_size(config_);
  const int64_t first =
      (entry.step % steps_per_epoch_) * config_.training.batch_size + entry.sample_offset;
  std::vector<int64_t> samples(order_.order().begin() + first,
                               order_.order().begin() + first + micro);
  key_message message =
      batch_message(key_kind::forward, entry.key, samples, train_, host_, config_.data.padding);
  message.step = entry.step;
  message.sample_offset = entry.sample_offset;
  message.replica_floor = entry.replica_floor;
  return message;
}

std::vector<key_message> training_run::handle(const stage_output& report, double now_s) {
  if (!failure_.empty()) return {};
  if (report.what == stage_output::kind::loss_report && !std::isfinite(report.loss_sum)) {
    // A loss that is NaN or infinite never comes back: stop instead of training on garbage.
    const int64_t step = report.message.step;
    char rate[32];
    std::snprintf(rate, sizeof rate, "%g",
                  learning_rate_at(config_.training, step, steps_per_epoch_, total_steps_));
    failure_ = "training diverged: the loss of step " + std::to_string(step + 1) + " is " +
               (std::isnan(report.loss_sum) ? "NaN" : "infinite") + " (lr " + rate +
               "); lower training.lr, raise training.warmup_steps, or resume from an earlier "
               "checkpoint";
    return {};
  }
  if (report.message.key >= first_evaluation_key) return handle_evaluation(report, now_s);
  if (report.what == stage_output::kind::retired) return handle_retired(report.message.key, now_s);
  if (report.what != stage_output::kind::loss_report) {
    ++ignored_reports_;
    return {};
  }
  epoch_totals_.add(totals_of(report));
  step_losses& losses = step_losses_[report.message.step];
  losses.totals.add(totals_of(report));
  ++losses.reports;
  log_completed_steps(now_s, false);
  return {};
}

batch_totals training_run::totals_of(const stage_output& report) {
  return {report.loss_sum, report.correct, report.samples};
}

void training_run::log_completed_steps(double now_s, bool all_reported) {
  const int64_t micro_batches = keys_per_step(config_);
  while (!unlogged_steps_.empty()) {
    const int64_t boundary = unlogged_steps_.front();
    for (; next_logged_step_ < boundary; ++next_logged_step_) {
      auto found = step_losses_.find(next_logged_step_);
      if (!all_reported && (found == step_losses_.end() || found->second.reports < micro_batches))
        return;  // a loss report still on its way: stage 0's retirement overtook it
      if (found == step_losses_.end()) continue;
      interval_.add(found->second.totals);
      step_losses_.erase(found);
    }
    unlogged_steps_.pop_front();
    observer_.on_step(boundary, total_steps_, epoch_, interval_.mean_loss(),
                      samples_of(interval_) / std::max(1e-9, now_s - last_log_s_));
    if (config_.metrics.log_interval > 0 && boundary % config_.metrics.log_interval == 0) {
      emit_metrics(epoch_, std::nullopt, now_s, boundary);
    }
  }
}

std::vector<key_message> training_run::handle_retired(uint64_t key, double now_s) {
  if (finished_ || !admission_ || !admission_->retired(key)) {
    ++ignored_reports_;
    return {};
  }
  const int64_t micro_batches = keys_per_step(config_);
  const int64_t retired = admission_->retired_count();
  if (retired % micro_batches == 0) {
    const int64_t step = retired / micro_batches;
    // Reports travel apart: the step is logged once the last stage's losses for it are in.
    unlogged_steps_.push_back(step);
    log_completed_steps(now_s, false);
    note_step_for_checkpoint(step, now_s);
    const int64_t interval = config_.training.eval_interval_steps;
    if (interval > 0 && step % interval == 0 && !admission_->finished()) {
      evaluation_requested_ = true;  // within the epoch: its end evaluates anyway
    }
  }
  if ((checkpoint_requested_ || evaluation_requested_) && !paused_) {
    admission_->pause_at_step_boundary();
    paused_ = true;
  }
  if (!admission_->finished()) {
    // Paused, admission still runs up to the step boundary it pauses at: in async mode with
    // several micro-batches a step's last keys may not have been admitted yet.
    std::vector<key_message> admitted = admit_training();
    if (paused_ && admission_->quiet()) {
      if (evaluation_requested_) {
        // The pipeline is quiet at a step boundary: evaluate there, then go on.
        evaluation_requested_ = false;
        evaluating_within_epoch_ = true;
        evaluation_start_s_ = now_s;
        return start_evaluation(now_s);
      }
      due_step_ = retired / micro_batches;
      after_ = after_checkpoint::admit;
    }
    return admitted;
  }
  train_s_ += now_s - epoch_start_s_;
  return start_evaluation(now_s);
}

std::vector<key_message> training_run::start_evaluation(double now_s) {
  (void)now_s;
  evaluation_ = batch_totals();
  evaluation_reports_ = 0;
  evaluation_batches_ = (test_.count() + evaluation_batch - 1) / evaluation_batch;
  std::vector<key_message> messages;
  for (int64_t b = 0; b < evaluation_batches_; ++b) {
    std::vector<int64_t> samples;
    for (int64_t i = b * evaluation_batch; i < std::min(test_.count(), (b + 1) * evaluation_batch);
         ++i) {
      samples.push_back(i);
    }
    messages.push_back(batch_message(key_kind::evaluate, first_evaluation_key + b, samples, test_,
                                     host_, config_.data.padding));
  }
  return messages;
}

std::vector<key_message> training_run::handle_evaluation(const stage_output& report, double now_s) {
  evaluation_.add(totals_of(report));
  if (++evaluation_reports_ < evaluation_batches_) return {};
  if (evaluation_only_) {
    keep_evaluation_figures();
    emit_metrics(epoch_, evaluation_, now_s);
    finish(now_s);
    return {};
  }
  if (evaluating_within_epoch_) return after_evaluation_within_epoch(now_s);
  // The last stage sent the epoch's losses before these results, on the same connection.
  log_completed_steps(now_s, true);
  train_samples_ += epoch_totals_.samples;
  ++epoch_;
  summary_.epochs = epoch_;
  record_evaluation(now_s);
  return after_evaluation(now_s);
}

void training_run::keep_evaluation_figures() {
  summary_.final_test_accuracy = evaluation_.accuracy();
  summary_.final_test_loss = evaluation_.mean_loss();
  summary_.evaluated = true;
}

void training_run::record_evaluation(double now_s) {
  keep_evaluation_figures();
  const double target = config_.training.target_accuracy;
  if (target > 0 && !summary_.time_to_target_s && evaluation_.accuracy() >= target) {
    summary_.time_to_target_s = now_s - start_s_;
    summary_.steps_to_target = retired_steps();
  }
  emit_metrics(epoch_, evaluation_, now_s);
}

std::vector<key_message> training_run::after_evaluation_within_epoch(double now_s) {
  evaluating_within_epoch_ = false;
  // The record's loss and rate cover the epoch so far; its evaluation time is not training.
  record_evaluation(now_s);
  epoch_start_s_ += now_s - evaluation_start_s_;
  if (checkpoint_requested_) {
    due_step_ = retired_steps();
    after_ = after_checkpoint::admit;
    return {};
  }
  paused_ = false;
  admission_->resume();
  return admit_training();
}

std::vector<key_message> training_run::after_evaluation(double now_s) {
  const bool more = epoch_ * steps_per_epoch_ < total_steps_;
  // The last epoch ends with a checkpoint whenever the job takes them at intervals.
  if (checkpoint_requested_ || (!more && checkpoints_enabled())) {
    due_step_ = std::min(total_steps_, epoch_ * steps_per_epoch_);
    after_ = more ? after_checkpoint::start_epoch : after_checkpoint::finish;
    return {};
  }
  if (more) return start_epoch(now_s);
  finish(now_s);
  return {};
}

void training_run::finish(double now_s) {
  summary_.steps = admission_ ? admission_->retired_count() / keys_per_step(config_)
                              : (resume_ ? resume_->step : 0);
  summary_.wall_s = now_s - start_s_;
  summary_.samples_per_s =
      train_s_ > 0 ? static_cast<double>(train_samples_) / tokens_per_sample() / train_s_ : 0.0;
  if (language_model()) {
    summary_.tokens_per_s = summary_.samples_per_s * tokens_per_sample();
    if (summary_.evaluated) summary_.bits_per_byte = summary_.final_test_loss / std::log(2.0);
  }
  finished_ = true;
}

bool training_run::checkpoints_enabled() const {
  return config_.checkpoint.interval_steps > 0 || config_.checkpoint.interval_s > 0;
}

void training_run::note_step_for_checkpoint(int64_t step, double now_s) {
  const checkpoint_config& c = config_.checkpoint;
  if ((c.interval_steps > 0 && step % c.interval_steps == 0) ||
      (c.interval_s > 0 && now_s - last_checkpoint_s_ >= c.interval_s)) {
    checkpoint_requested_ = true;
  }
}

void training_run::request_checkpoint(bool stop_after) {
  if (finished_) return;
  checkpoint_requested_ = true;
  stop_after_checkpoint_ = stop_after_checkpoint_ || stop_after;
}

std::vector<key_message> training_run::checkpoint_done(double now_s) {
  if (!due_step_) return {};
  due_step_.reset();
  checkpoint_requested_ = false;
  paused_ = false;
  last_checkpoint_s_ = now_s;
  if (stop_after_checkpoint_ && after_ != after_checkpoint::finish) {
    stopped_ = true;
    if (after_ == after_checkpoint::admit) {
      // The epoch was cut short: count its training so far.
      train_s_ += now_s - epoch_start_s_;
      train_samples_ += epoch_totals_.samples;
    }
    finish(now_s);
    return {};
  }
  switch (after_) {
    case after_checkpoint::admit:
      admission_->resume();
      return admit_training();
    case after_checkpoint::start_epoch:
      return start_epoch(now_s);
    case after_checkpoint::finish:
      finish(now_s);
      return {};
  }
  return {};
}

int64_t training_run::retired_steps() const {
  return admission_ ? admission_->retired_count() / keys_per_step(config_) : 0;
}

run_progress training_run::progress(double now_s) const {
  run_progress progress;
  progress.step = due_step_ ? *due_step_ : retired_steps();
  progress.epoch = epoch_;
  progress.wall_s = now_s - start_s_;
  progress.train_s = train_s_;
  progress.train_samples = train_samples_;
  if (due_step_ && after_ == after_checkpoint::admit) {
    progress.train_s += now_s - epoch_start_s_;
    progress.train_samples += epoch_totals_.samples;
  }
  progress.time_to_target_s = summary_.time_to_target_s;
  progress.steps_to_target = summary_.steps_to_target;
  progress.test_accuracy = summary_.final_test_accuracy;
  progress.test_loss = summary_.final_test_loss;
  return progress;
}

void training_run::emit_metrics(int64_t epoch, std::optional<batch_totals> test, double now_s,
                                std::optional<int64_t> step) {
  // A log-interval record covers the steps since the previous one; an evaluation record
  // covers the whole epoch.
  const batch_totals& span = test ? epoch_totals_ : interval_;
  const double seconds = test ? now_s - epoch_start_s_ : now_s - last_log_s_;
  metrics_record record;
  record.step = step ? *step : retired_steps();
  record.epoch = epoch;
  record.loss = span.mean_loss();
  record.learning_rate =
      learning_rate_at(config_.training, record.step, steps_per_epoch_, total_steps_);
  record.samples_per_s = seconds > 0 ? samples_of(span) / seconds : 0.0;
  record.wall_s = now_s - start_s_;
  if (language_model()) record.tokens_per_s = record.samples_per_s * tokens_per_sample();
  if (test) {
    record.test_accuracy = test->accuracy();
    record.test_loss = test->mean_loss();
    if (language_model()) record.bits_per_byte = test->mean_loss() / std::log(2.0);
  }
  observer_.on_metrics(record);
  interval_ = batch_totals();
  last_log_s_ = now_s;
}

int64_t training_run::keys_in_flight() const {
  return (admission_ ? admission_->active() : 0) +
         std::max<int64_t>(0, evaluation_batches_ - evaluation_reports_);
}

}  // namespace troupe::actors
