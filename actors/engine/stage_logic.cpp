#include "actors/engine/stage_logic.h"

#include <algorithm>
#include <cmath>

#include "layers/check.h"
#include "layers/loss.h"
#include "layers/optimizer.h"

namespace troupe::actors {

stage_logic::stage_logic(stage_settings settings, stage_device& device)
    : settings_(std::move(settings)), device_(device) {
  TROUPE_CHECK(settings_.min_update_interval >= 1);
  TROUPE_CHECK(settings_.index >= 0 && settings_.index < settings_.count);
  TROUPE_CHECK(settings_.replica >= 0 && settings_.replica < settings_.replicas);
  if (replicated()) ring_ = make_ring();
}

std::vector<stage_output> stage_logic::handle(const key_message& message, std::string* refusal) {
  std::vector<stage_output> outputs;
  std::string error;
  if (message.kind == key_kind::reduce) {
    handle_reduce(message, &outputs, refusal);
    return outputs;
  }
  if (reduction_pending_ && message.kind != key_kind::backward) {
    if (refusal) *refusal = "a forward or evaluation while the step's gradients are being summed";
    ++refused_;
    return outputs;
  }
  if (message.kind == key_kind::step || step_pending_) {
    // Only a step message may follow a held step, and only a held step takes one.
    const bool fits = message.kind == key_kind::step && step_pending_ &&
                      std::isfinite(message.norm_squared) && message.norm_squared >= 0;
    if (!fits) {
      if (refusal) {
        *refusal = step_pending_
                       ? "a key message while an optimizer step waits for its step message"
                       : "a step message but no optimizer step is held here";
      }
      ++refused_;
      return outputs;
    }
    handle_step_message(message, &outputs);
    return outputs;
  }
  const bool known = message.kind != key_kind::backward || forward_versions_.count(message.key);
  const bool labelled = message.kind == key_kind::backward || !is_last() || message.labels;
  if (!known || !labelled || !device_.accepts(message, &error) || !labels_fit(message, &error)) {
    if (refusal) {
      *refusal = !known
                     ? "backward for key " + std::to_string(message.key) + " never forwarded here"
                 : !labelled ? "a key reached the last stage without labels"
                             : error;
    }
    ++refused_;
    return outputs;
  }
  if (message.kind == key_kind::evaluate) {
    evaluate(message, &outputs);
  } else if (!ordered() || is_next_pass(pass_of(message), micro_batch_of(message))) {
    run_pass(message, &outputs);
  } else {
    early_[{static_cast<int>(pass_of(message)), micro_batch_of(message)}] = message;
  }
  return outputs;
}

bool stage_logic::labels_fit(const key_message& message, std::string* error) const {
  const int64_t classes = device_.classes();
  if (!is_last() || !message.labels || message.kind == key_kind::backward || classes <= 0)
    return true;
  const std::vector<int32_t>& labels = *message.labels;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] == layers::ignored_label || (labels[i] >= 0 && labels[i] < classes)) continue;
    *error = "label " + std::to_string(labels[i]) + " (row " + std::to_string(i) + " of key " +
             std::to_string(message.key) + ") is outside the model's " + std::to_string(classes) +
             " classes";
    return false;
  }
  return true;
}

scheduled_pass::kind stage_logic::backward_pass() const {
  return settings_.turn->splits_backward ? scheduled_pass::kind::input_gradient
                                         : scheduled_pass::kind::backward;
}

scheduled_pass::kind stage_logic::pass_of(const key_message& message) const {
  return message.kind == key_kind::forward ? scheduled_pass::kind::forward : backward_pass();
}

bool stage_logic::is_next_pass(scheduled_pass::kind kind, int micro_batch) const {
  const scheduled_pass& next = settings_.turn->next_pass();
  return next.stage == settings_.index && next.what == kind && next.micro_batch == micro_batch;
}

void stage_logic::run_pass(const key_message& message, std::vector<stage_output>* outputs) {
  if (message.kind == key_kind::forward) {
    forward(message, outputs);
  } else {
    backward(message, outputs);
  }
  // The turn moves on once the pass is done, so that the worker runs one pass at a time.
  if (!ordered()) return;
  settings_.turn->advance();
  if (is_last() && message.kind == key_kind::forward) {
    // The last stage turned the forward around: its backward was the order's next pass.
    TROUPE_CHECK(is_next_pass(backward_pass(), micro_batch_of(message)));
    settings_.turn->advance();
  }
}

bool stage_logic::has_ready_work() const {
  if (step_due()) return true;
  if (!ordered()) return false;
  const scheduled_pass& next = settings_.turn->next_pass();
  if (next.stage != settings_.index) return false;
  return next.what == scheduled_pass::kind::weight_gradients ||
         early_.count({static_cast<int>(next.what), next.micro_batch}) > 0;
}

std::vector<stage_output> stage_logic::run_ready_work() {
  std::vector<stage_output> outputs;
  if (step_due()) {
    finish_deferred_step();
    return outputs;
  }
  if (!ordered()) return outputs;
  const scheduled_pass next = settings_.turn->next_pass();
  if (next.stage != settings_.index) return outputs;
  if (next.what == scheduled_pass::kind::weight_gradients) {
    run_weight_gradients();
    settings_.turn->advance();
    return outputs;
  }
  auto found = early_.find({static_cast<int>(next.what), next.micro_batch});
  if (found == early_.end()) return outputs;
  const key_message message = std::move(found->second);
  early_.erase(found);
  run_pass(message, &outputs);
  return outputs;
}

void stage_logic::forward(const key_message& message, std::vector<stage_output>* outputs) {
  finish_deferred_step();  // a new step's key sees the weights of the step before
  forward_versions_[message.key] = version_;
  replica_floor_ = std::max(replica_floor_, message.replica_floor);
  if (settings_.predict_weights && delay_ > 0) {
    if (predicted_versions_.insert(version_).second) {
      device_.stash_predicted_weights(
          version_, static_cast<float>(delay_ * settings_.learning_rate(version_)));
    }
    device_.use_weights(version_);
  }
  key_message next = message;
  next.payload = device_.forward(message, true);
  peak_contexts_ = std::max(peak_contexts_, device_.held_contexts());
  if (!is_last()) {
    outputs->push_back({stage_output::kind::to_next_stage, next});
    return;
  }
  // The last stage turns around: loss, then this stage's own backward pass. A dynamic key's
  // loss is the mean over its scored rows (padded positions are not).
  const int64_t counted = layers::counted_labels(*message.labels);
  const float scale = message.instances ? settings_.key_gradient_scale /
                                              static_cast<float>(std::max<int64_t>(1, counted))
                                        : settings_.gradient_scale;
  loss_result loss = device_.loss(next.payload, *message.labels, scale, true);
  stage_output report{stage_output::kind::loss_report, message};
  report.message.payload = layers::tensor();
  report.loss_sum = loss.loss_sum;
  report.correct = loss.correct;
  report.samples = counted;
  outputs->push_back(report);
  next.kind = key_kind::backward;
  next.payload = loss.gradient;
  backward(next, outputs);
}

void stage_logic::evaluate(const key_message& message, std::vector<stage_output>* outputs) {
  finish_deferred_step();
  key_message next = message;
  next.payload = device_.forward(message, false);
  if (!is_last()) {
    outputs->push_back({stage_output::kind::to_next_stage, next});
    return;
  }
  loss_result loss = device_.loss(next.payload, *message.labels, 1.0f, false);
  stage_output report{stage_output::kind::loss_report, message};
  report.message.payload = layers::tensor();
  report.loss_sum = loss.loss_sum;
  report.correct = loss.correct;
  report.samples = layers::counted_labels(*message.labels);
  outputs->push_back(report);
}

void stage_logic::backward(key_message message, std::vector<stage_output>* outputs) {
  if (step_due()) finish_deferred_step();  // a pass sees the step before it
  auto found = forward_versions_.find(message.key);
  TROUPE_CHECK(found != forward_versions_.end());
  const int64_t forward_version = found->second;
  forward_versions_.erase(found);
  const int64_t staleness = version_ - forward_version;
  record(&staleness_, staleness);
  staleness_since_step_ += staleness;
  const bool stashed = (settings_.weight_stashing && staleness > 0) ||
                       predicted_versions_.count(forward_version) > 0;
  if (stashed) device_.use_weights(forward_version);
  record(&weight_staleness_, stashed ? 0 : staleness);
  message.payload = run_backward(message);
  const bool complete = count_backward();
  if (complete && replicated() && !averaging()) {
    // The sum needs every weight gradient; the step waits for it. Without global clipping the
    // backward goes on meanwhile.
    run_all_deferred();
    if (settings_.global_clipping) held_for_clipping_ = message;
    start_reduction(outputs);
    if (settings_.global_clipping) return;
  } else if (complete && settings_.global_clipping) {
    step_with_global_norm(std::move(message), outputs);
    return;
  } else if (complete) {
    // Zero-bubble: the step waits for the deferred W, which run in the cool-down after this
    // input gradient has gone on; with step_after_sending it waits for the gradient to go.
    step_after_deferred_ = true;
    if (!settings_.step_after_sending && deferred_.empty()) finish_deferred_step();
    if (averaging()) after_replica_step(outputs);
  }
  message.norm_squared = 0;
  if (settings_.index > 0) {
    outputs->push_back({stage_output::kind::to_previous_stage, message});
  } else {
    message.payload = layers::tensor();
    outputs->push_back({stage_output::kind::retired, message});
  }
}

layers::tensor stage_logic::run_backward(const key_message& message) {
  if (!ordered() || !settings_.turn->splits_backward) {
    return device_.backward(message, settings_.index > 0);
  }
  layers::tensor gradient = device_.backward_input(message, settings_.index > 0);
  deferred_.push_back(message.key);
  return gradient;
}

std::unique_ptr<ring_all_reduce> stage_logic::make_ring() const {
  // Sync replicas sum gradients; async ones average weights.
  return std::make_unique<ring_all_reduce>(
      settings_.replica, settings_.replicas,
      averaging() ? device_.weight_value_count() : device_.gradient_value_count(),
      ring_piece_floats, !device_.holds_values());
}

void stage_logic::step_with_global_norm(key_message message, std::vector<stage_output>* outputs) {
  run_all_deferred();  // the norm needs every weight gradient
  // The later stages' squared norms came with the message; add this stage's.
  const double norm_squared = message.norm_squared + device_.squared_gradient_norm();
  if (settings_.index > 0) {
    step_pending_ = true;
    message.norm_squared = norm_squared;
    outputs->push_back({stage_output::kind::to_previous_stage, message});
    return;
  }
  take_step(norm_squared);
  key_message step;
  step.kind = key_kind::step;
  step.key = message.key;
  step.step = message.step;
  step.sample_offset = message.sample_offset;
  step.norm_squared = norm_squared;
  outputs->push_back({stage_output::kind::to_next_stage, step});
}

void stage_logic::use_replica_group(std::shared_ptr<layers::device_group> group) {
  replica_group_ = std::move(group);
}

void stage_logic::start_reduction(std::vector<stage_output>* outputs) {
  reduction_pending_ = true;
  if (replica_group_) {
    device_.sum_gradients_in_group(*replica_group_);
    ++group_rounds_;
    finish_reduction(outputs);
    return;
  }
  device_.read_gradient_values(&scratch_);
  send_chunks(ring_->start(scratch_), outputs);
  if (ring_->finished()) finish_reduction(outputs);
}

void stage_logic::handle_reduce(const key_message& message, std::vector<stage_output>* outputs,
                                std::string* refusal) {
  std::string error = "a reduce message, but this stage has no replicas";
  std::vector<ring_chunk> to_send;
  if (!ring_ || !ring_->receive(chunk_of(message), &to_send, &error)) {
    if (refusal) *refusal = error;
    ++refused_;
    return;
  }
  send_chunks(to_send, outputs);
  if (ring_->finished()) {
    if (averaging()) {
      finish_average(outputs);
    } else {
      finish_reduction(outputs);
    }
  }
}

void stage_logic::send_chunks(const std::vector<ring_chunk>& chunks,
                              std::vector<stage_output>* outputs) {
  for (const ring_chunk& chunk : chunks) {
    outputs->push_back({stage_output::kind::to_replica_peer, reduce_message(chunk)});
  }
}

void stage_logic::finish_reduction(std::vector<stage_output>* outputs) {
  if (!replica_group_) {
    // Empty on a device of sizes only, which charges the time.
    device_.set_gradient_values(ring_->take_result());
  }
  reduction_pending_ = false;
  if (held_for_clipping_) {
    key_message message = std::move(*held_for_clipping_);
    held_for_clipping_.reset();
    step_with_global_norm(std::move(message), outputs);
    return;
  }
  take_step(settings_.clip_norm > 0 ? device_.squared_gradient_norm() : 0.0);
}

void stage_logic::after_replica_step(std::vector<stage_output>* outputs) {
  record(&replica_staleness_, std::max<int64_t>(0, version_ - replica_floor_));
  if (version_ % settings_.replica_sync_interval != 0) return;
  if (replica_group_) {
    // The group's collective is the average: every rank comes to it at the same version.
    device_.average_weights_in_group(*replica_group_);
    ++group_rounds_;
    return;
  }
  ++averages_due_;
  if (!ring_->under_way()) start_average(outputs);  // else once the one under way ends
}

void stage_logic::start_average(std::vector<stage_output>* outputs) {
  --averages_due_;
  device_.read_weight_values(&sent_weights_);
  send_chunks(ring_->start(sent_weights_), outputs);
  if (ring_->finished()) finish_average(outputs);
}

void stage_logic::finish_average(std::vector<stage_output>* outputs) {
  const std::vector<float>& sum = ring_->take_result();
  // On a device of sizes only these are empty, and the device charges the time.
  device_.read_weight_values(&scratch_);
  if (device_.holds_values()) {
    const float share = 1.0f / static_cast<float>(settings_.replicas);
    float* weights = scratch_.data();
    const float *sent = sent_weights_.data(), *total = sum.data();
    for (size_t i = 0; i < scratch_.size(); ++i) weights[i] += total[i] * share - sent[i];
  }
  device_.set_weight_values(scratch_);
  if (averages_due_ > 0) start_average(outputs);
}

void stage_logic::run_weight_gradients() {
  // Global clipping ran the step's W already, to take its norm.
  if (deferred_.empty()) return;
  device_.backward_weights(deferred_.front());
  deferred_.pop_front();
  if (deferred_.empty() && step_after_deferred_) finish_deferred_step();
}

void stage_logic::finish_deferred_step() {
  if (!step_after_deferred_) return;
  step_after_deferred_ = false;  // before the W: the last of them must not step as well
  run_all_deferred();
  take_step(settings_.clip_norm > 0 ? device_.squared_gradient_norm() : 0.0);
}

void stage_logic::run_all_deferred() {
  while (!deferred_.empty()) run_weight_gradients();
}

double stage_logic::step_learning_rate() const {
  const double rate = settings_.learning_rate(version_);
  if (settings_.pipemare_warmup_steps <= 0) return rate;
  const double delay = std::max(1.0, static_cast<double>(staleness_since_step_) /
                                         static_cast<double>(settings_.min_update_interval));
  const double fading =
      1.0 - std::min(1.0, static_cast<double>(version_) /
                              static_cast<double>(settings_.pipemare_warmup_steps));
  return rate * std::pow(delay, -fading);
}

double stage_logic::step_momentum() const {
  const double momentum = settings_.nesterov_momentum;
  if (momentum <= 0) return -1;  // the job's
  if (momentum >= 0.99) return momentum;
  const double stages = static_cast<double>(std::max(1, settings_.count));
  const double delay = static_cast<double>(staleness_since_step_) /
                       static_cast<double>(settings_.min_update_interval);
  return momentum + std::min(delay, stages) * (0.99 - momentum) / stages;
}

bool stage_logic::count_backward() {
  if (++keys_since_step_ < settings_.min_update_interval) return false;
  keys_since_step_ = 0;
  return true;
}

void stage_logic::handle_step_message(const key_message& message,
                                      std::vector<stage_output>* outputs) {
  step_pending_ = false;
  take_step(message.norm_squared);
  if (!is_last()) {
    outputs->push_back({stage_output::kind::to_next_stage, message});
    return;
  }
  // Every stage has stepped: the step's last key is done.
  key_message retired = message;
  retired.norm_squared = 0;
  outputs->push_back({stage_output::kind::retired, retired});
}

void stage_logic::take_step(double norm_squared) {
  const float scale = layers::clip_scale(norm_squared, settings_.clip_norm);
  if (settings_.weight_stashing) {
    // Keys whose forward used the current weights still need them for their backward.
    const bool needed = std::any_of(forward_versions_.begin(), forward_versions_.end(),
                                    [&](const auto& entry) { return entry.second == version_; });
    if (needed) device_.stash_weights(version_);
  }
  device_.step(static_cast<float>(step_learning_rate()), scale,
               static_cast<float>(step_momentum()));
  delay_ = static_cast<double>(staleness_since_step_) / settings_.min_update_interval;
  staleness_since_step_ = 0;
  ++version_;
  if (settings_.weight_stashing || settings_.predict_weights) {
    int64_t oldest = version_;
    for (const auto& entry : forward_versions_) oldest = std::min(oldest, entry.second);
    device_.release_weights_before(oldest);
    predicted_versions_.erase(predicted_versions_.begin(), predicted_versions_.lower_bound(oldest));
  }
}

void stage_logic::record(std::vector<int64_t>* histogram, int64_t value) {
  TROUPE_CHECK(value >= 0);
  if (histogram->size() <= static_cast<size_t>(value)) histogram->resize(value + 1, 0);
  ++(*histogram)[value];
}

stage_state stage_logic::save_state() {
  finish_deferred_step();
  stage_state state = device_.save_state();
  state.stage = settings_.index;
  state.stages = settings_.count;
  state.weight_version = version_;
  state.keys_since_step = keys_since_step_;
  return state;
}

bool stage_logic::load_state(const stage_state& state, bool weights_only, std::string* error) {
  if (state.stage != settings_.index || state.stages != settings_.count) {
    *error = "the state of stage " + std::to_string(state.stage) + " of " +
             std::to_string(state.stages) + " cannot load into stage " +
             std::to_string(settings_.index) + " of " + std::to_string(settings_.count);
    return false;
  }
  if (!device_.load_state(state, weights_only, error)) return false;
  // Everything a key in flight or a step under way left behind goes; what stays is the stage's
  // settings, its device, its replica group and the run's statistics (histograms, peaks,
  // refusals, rounds).
  forward_versions_.clear();
  deferred_.clear();
  early_.clear();
  if (ordered()) settings_.turn->next.store(0);
  step_after_deferred_ = false;
  step_pending_ = false;
  predicted_versions_.clear();
  if (replicated()) ring_ = make_ring();
  reduction_pending_ = false;
  held_for_clipping_.reset();
  averages_due_ = 0;
  sent_weights_.clear();
  replica_floor_ = 0;  // the replicas' versions went back too; the next forward says where
  if (!weights_only) {
    version_ = state.weight_version;
    keys_since_step_ = state.keys_since_step;
    staleness_since_step_ = 0;
    delay_ = 0;
  }
  return true;
}

void stage_logic::keys_held(std::vector<int64_t>* keys) const {
  keys->clear();
  for (const auto& entry : forward_versions_) keys->push_back(static_cast<int64_t>(entry.first));
  std::sort(keys->begin(), keys->end());
}

}  // namespace troupe::actors
