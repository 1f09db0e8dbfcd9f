#include "sim/timed_stage_device.h"

#include <algorithm>

#include "sim/shape_backend.h"

namespace troupe::sim {

timed_stage_device::timed_stage_device(stage_cost cost, layers::shape input, layers::shape output,
                                       std::unique_ptr<actors::stage_device> numerics)
    : cost_(std::move(cost)),
      input_(std::move(input)),
      output_(std::move(output)),
      numerics_(std::move(numerics)) {
  note_memory();
}

timed_stage_device::timed_stage_device(stage_cost cost, graph_stage_cost graph,
                                       std::unique_ptr<actors::stage_device> numerics)
    : cost_(std::move(cost)), graph_(std::move(graph)), numerics_(std::move(numerics)) {
  note_memory();
}

double timed_stage_device::take_charge() {
  const double charge = charge_s_;
  charge_s_ = 0;
  return charge;
}

layers::tensor timed_stage_device::shaped(int64_t batch, const layers::shape& per_sample) const {
  layers::shape dims{batch};
  dims.insert(dims.end(), per_sample.begin(), per_sample.end());
  return layers::tensor(shape_backend(), std::move(dims));
}

void timed_stage_device::note_memory() {
  const double bytes = cost_.state_bytes() * (1 + static_cast<double>(stashed_.size()) / 2) +
                       cost_.context_bytes_per_sample() * static_cast<double>(context_samples_);
  peak_bytes_ = std::max(peak_bytes_, bytes);
}

bool timed_stage_device::accepts(const actors::key_message& message, std::string* error) const {
  if (numerics_) return numerics_->accepts(message, error);
  if (graph_ && !message.instances) {
    *error = "a key of a graph model without its instances";
    return false;
  }
  if (message.payload.empty() || message.payload.rows() <= 0) {
    *error = "a key message without a payload";
    return false;
  }
  return true;
}

layers::tensor timed_stage_device::graph_forward(const actors::key_message& message,
                                                 bool training) {
  const std::vector<layers::instance>& instances = *message.instances;
  charge_s_ += graph_->forward_s(instances, training);
  const actors::key_layout layout = actors::layout_of(instances);
  if (training) {
    // The parts' activations stay until the backward pass (counted per part of the key).
    contexts_[message.key] = layout.parts();
    context_samples_ += layout.parts();
    note_memory();
  }
  if (numerics_) return numerics_->forward(message, training);
  return layers::tensor(shape_backend(), {graph_->output_rows(layout), graph_->output_width()});
}

layers::tensor timed_stage_device::graph_backward(const actors::key_message& message,
                                                  bool need_input_gradient) {
  const std::vector<layers::instance>& instances = *message.instances;
  charge_s_ += graph_->backward_s(instances, need_input_gradient);
  release_context(message.key);
  if (numerics_) return numerics_->backward(message, need_input_gradient);
  if (!need_input_gradient) return layers::tensor();
  const actors::key_layout layout = actors::layout_of(instances);
  return layers::tensor(shape_backend(), {graph_->input_rows(layout), graph_->input_width()});
}

void timed_stage_device::release_context(uint64_t key) {
  auto found = contexts_.find(key);
  if (found == contexts_.end()) return;
  context_samples_ -= found->second;
  contexts_.erase(found);
}

layers::tensor timed_stage_device::forward(const actors::key_message& message, bool training) {
  if (graph_) return graph_forward(message, training);
  const int64_t batch = message.payload.rows();
  charge_s_ += cost_.forward_s(batch, training);
  if (training) {
    contexts_[message.key] = batch;
    context_samples_ += batch;
    note_memory();
  }
  if (numerics_) return numerics_->forward(message, training);
  return shaped(batch, output_);
}

actors::loss_result timed_stage_device::loss(const layers::tensor& logits,
                                             const std::vector<int32_t>& labels, float scale,
                                             bool want_gradient) {
  charge_s_ += graph_ ? graph_->loss_s(logits.rows()) : cost_.loss_s(logits.rows());
  if (numerics_) return numerics_->loss(logits, labels, scale, want_gradient);
  actors::loss_result result;
  if (want_gradient) result.gradient = layers::tensor(shape_backend(), logits.dims());
  return result;
}

layers::tensor timed_stage_device::backward(const actors::key_message& message,
                                            bool need_input_gradient) {
  if (graph_) return graph_backward(message, need_input_gradient);
  const int64_t batch = message.payload.rows();
  charge_s_ += cost_.backward_s(batch, need_input_gradient);
  release_context(message.key);
  if (numerics_) return numerics_->backward(message, need_input_gradient);
  return need_input_gradient ? shaped(batch, input_) : layers::tensor();
}

layers::tensor timed_stage_device::backward_input(const actors::key_message& message,
                                                  bool need_input_gradient) {
  // A graph stage's backward pass is whole (its stage device does not split it).
  if (graph_) return graph_backward(message, need_input_gradient);
  const int64_t batch = message.payload.rows();
  charge_s_ += cost_.backward_s(batch, need_input_gradient) - cost_.deferred_weights_s(batch);
  auto found = contexts_.find(message.key);
  if (found != contexts_.end()) {
    // The context stays until W: only its weight-gradient inputs, counted as all of it.
    pending_weights_[message.key] = found->second;
    contexts_.erase(found);
  }
  if (numerics_) return numerics_->backward_input(message, need_input_gradient);
  return need_input_gradient ? shaped(batch, input_) : layers::tensor();
}

void timed_stage_device::backward_weights(uint64_t key) {
  auto found = pending_weights_.find(key);
  if (found != pending_weights_.end()) {
    charge_s_ += cost_.deferred_weights_s(found->second);
    context_samples_ -= found->second;
    pending_weights_.erase(found);
  }
  if (numerics_) numerics_->backward_weights(key);
}

double timed_stage_device::squared_gradient_norm() {
  // Without numerics there are no gradients; a norm of 0 never clips.
  return numerics_ ? numerics_->squared_gradient_norm() : 0.0;
}

void timed_stage_device::step(float learning_rate, float gradient_scale, float momentum) {
  charge_s_ += graph_ ? graph_->step_s() : cost_.step_s();
  if (numerics_) numerics_->step(learning_rate, gradient_scale, momentum);
}

void timed_stage_device::stash_weights(int64_t version) {
  charge_s_ += graph_ ? graph_->stash_s() : cost_.stash_s();
  stashed_.insert(version);
  note_memory();
  if (numerics_) numerics_->stash_weights(version);
}

void timed_stage_device::stash_predicted_weights(int64_t version, float distance) {
  charge_s_ += graph_ ? graph_->predict_s() : cost_.predict_s();
  stashed_.insert(version);
  note_memory();
  if (numerics_) numerics_->stash_predicted_weights(version, distance);
}

void timed_stage_device::use_weights(int64_t version) {
  if (numerics_) numerics_->use_weights(version);
}

void timed_stage_device::release_weights_before(int64_t version) {
  stashed_.erase(stashed_.begin(), stashed_.lower_bound(version));
  if (numerics_) numerics_->release_weights_before(version);
}

size_t timed_stage_device::held_contexts() const {
  return contexts_.size() + pending_weights_.size();
}

std::vector<layers::parameter*> timed_stage_device::parameters() {
  return numerics_ ? numerics_->parameters() : std::vector<layers::parameter*>{};
}

void timed_stage_device::read_gradient_values(std::vector<float>* values) {
  if (shared_memory_ranks_ == 0) charge_s_ += cost_.parameter_copy_s();
  if (numerics_) {
    numerics_->read_gradient_values(values);
  } else {
    values->clear();
  }
}

double timed_stage_device::shared_memory_copies(bool average) const {
  // parameter_copy_s() is calibration's copy out, add and copy back of each value, halved:
  // three values of memory traffic. The group clears its sum (one), adds every rank's values
  // into it (three each) and copies it back (two); an average then scales it (two).
  const double traffic = 3.0 * shared_memory_ranks_ + 3 + (average ? 2 : 0);
  return traffic / 3;
}

void timed_stage_device::set_gradient_values(const std::vector<float>& values) {
  // The passes over the gradients since read_gradient_values(): the ring's copy of the
  // contribution, its adds and copies of the chunks, this copy back.
  charge_s_ +=
      (shared_memory_ranks_ > 0 ? shared_memory_copies(false) : 3.0) * cost_.parameter_copy_s();
  if (numerics_) numerics_->set_gradient_values(values);
}

int64_t timed_stage_device::gradient_value_count() {
  return numerics_ ? numerics_->gradient_value_count() : cost_.parameters();
}

void timed_stage_device::read_weight_values(std::vector<float>* values) {
  if (shared_memory_ranks_ == 0) charge_s_ += cost_.parameter_copy_s();
  if (numerics_) {
    numerics_->read_weight_values(values);
  } else {
    values->clear();
  }
}

void timed_stage_device::set_weight_values(const std::vector<float>& values) {
  // The passes over the weights besides the two reads: the ring's copy of the contribution,
  // its adds and copies of the chunks, the average (over three arrays into one), this copy
  // back.
  charge_s_ +=
      (shared_memory_ranks_ > 0 ? shared_memory_copies(true) : 5.0) * cost_.parameter_copy_s();
  if (numerics_) numerics_->set_weight_values(values);
}

int64_t timed_stage_device::weight_value_count() {
  return numerics_ ? numerics_->weight_value_count() : cost_.parameters();
}

actors::stage_state timed_stage_device::save_state() {
  return numerics_ ? numerics_->save_state() : actors::stage_state{};
}

bool timed_stage_device::load_state(const actors::stage_state& state, bool weights_only,
                                    std::string* error) {
  contexts_.clear();
  pending_weights_.clear();
  context_samples_ = 0;
  stashed_.clear();
  return numerics_ ? numerics_->load_state(state, weights_only, error) : true;
}

}  // namespace troupe::sim
