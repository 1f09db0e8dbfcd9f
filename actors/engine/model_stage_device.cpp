#include "actors/engine/model_stage_device.h"

#include <algorithm>

#include "actors/engine/sequential_trainer.h"
#include "actors/engine/stage_settings.h"
#include "layers/loss.h"

namespace troupe::actors {

model_stage_device::model_stage_device(const job_config& config, stage_range range,
                                       layers::backend& device)
    : device_(device),
      stream_(device.create_stream()),
      seed_(config.training.seed),
      range_(range),
      stages_(config.parallelism.stages),
      recompute_(config.parallelism.recompute) {
  device.set_gemm_precision(stream_, config.training.precision);
}

model_stage_device::~model_stage_device() {
  device_.synchronize(stream_);
  device_.destroy_stream(stream_);
}

void model_stage_device::adopt_parameters(std::vector<layers::parameter*> parameters,
                                          std::vector<std::string> names,
                                          const job_config& config) {
  parameters_ = std::move(parameters);
  names_ = std::move(names);
  layers::optimizer_settings optimizer = optimizer_settings_of(config.training);
  // The delay-corrected Nesterov method's look-ahead (stage_settings::nesterov_momentum).
  optimizer.nesterov = optimizer.nesterov || nesterov_correction(config);
  optimizer_ = std::make_unique<layers::optimizer>(stream_, optimizer, parameters_);
  device_.synchronize(stream_);  // the initial weights are written on stream_
  resting_bytes_ = device_.bytes_in_use();
  device_.reset_peak_bytes();
}

loss_result model_stage_device::loss(const layers::tensor& logits,
                                     const std::vector<int32_t>& labels, float scale,
                                     bool want_gradient) {
  layers::int_tensor label_tensor(device_, static_cast<int64_t>(labels.size()));
  label_tensor.copy_from_host(stream_, labels.data());
  layers::loss_output output =
      layers::softmax_cross_entropy(stream_, logits, label_tensor, scale, want_gradient);
  // read_totals() synchronizes stream_, after the gradient was written.
  layers::loss_totals totals = layers::read_totals(stream_, output);
  return {output.gradient, totals.loss_sum, totals.correct};
}

double model_stage_device::squared_gradient_norm() {
  return optimizer_->squared_gradient_norm(stream_);
}

void model_stage_device::step(float learning_rate, float gradient_scale, float momentum) {
  optimizer_->step(stream_, learning_rate, gradient_scale, momentum);
  device_.synchronize(stream_);
}

void model_stage_device::stash_weights(int64_t version) {
  std::vector<layers::tensor>& copies = stash_[version];
  copies.clear();
  for (layers::parameter* p : parameters_) copies.push_back(p->value.clone(stream_));
  device_.synchronize(stream_);
}

void model_stage_device::stash_predicted_weights(int64_t version, float distance) {
  stash_weights(version);
  const layers::optimizer_settings& settings = optimizer_->settings();
  if (settings.kind != layers::optimizer_kind::sgd || settings.momentum == 0) return;
  std::vector<layers::tensor>& copies = stash_[version];
  for (size_t i = 0; i < copies.size(); ++i) {
    const std::vector<layers::tensor>& state = optimizer_->state(i);
    if (state.empty()) continue;
    device_.axpy(stream_, -distance, state[0].data(), copies[i].data(),
                 static_cast<size_t>(copies[i].size()));
  }
  device_.synchronize(stream_);
}

void model_stage_device::release_weights_before(int64_t version) {
  stash_.erase(stash_.begin(), stash_.lower_bound(version));
}

int64_t model_stage_device::peak_activation_bytes() const {
  return std::max<int64_t>(0, std::max(training_peak_, device_.peak_bytes()) - resting_bytes_);
}

void model_stage_device::begin_evaluation_pass() {
  training_peak_ = std::max(training_peak_, device_.peak_bytes());
  device_.reset_peak_bytes();
}

stage_state model_stage_device::save_state() {
  stage_state state;
  state.stages = stages_;
  state.first_block = static_cast<int64_t>(range_.first);
  state.last_block = static_cast<int64_t>(range_.last);
  state.seed = seed_;
  state.optimizer_steps = optimizer_->steps_taken();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const layers::parameter& p = *parameters_[i];
    state.parameters.push_back({names_[i], p.value.dims(), p.value.to_host(stream_)});
    if (p.has_gradient) {
      state.gradients.push_back({names_[i], p.gradient.dims(), p.gradient.to_host(stream_)});
    }
    const std::vector<layers::tensor>& extra = optimizer_->state(i);
    for (size_t k = 0; k < extra.size(); ++k) {
      state.optimizer_state.push_back(
          {names_[i] + optimizer_suffix(k), extra[k].dims(), extra[k].to_host(stream_)});
    }
  }
  return state;
}

bool model_stage_device::load_state(const stage_state& state, bool weights_only,
                                    std::string* error) {
  std::vector<std::pair<const named_tensor*, layers::tensor*>> copies;
  if (!match_weights(state.parameters, error, &copies)) return false;
  std::vector<bool> has_gradient(parameters_.size(), false);
  if (!weights_only && !match_training_state(state, &has_gradient, error, &copies)) return false;
  for (auto& [source, target] : copies) target->copy_from_host(stream_, source->values.data());
  device_.synchronize(stream_);
  if (!weights_only) {
    for (size_t i = 0; i < parameters_.size(); ++i) parameters_[i]->has_gradient = has_gradient[i];
    optimizer_->set_steps_taken(state.optimizer_steps);
  }
  forget_keys();
  stash_.clear();
  next_pass_version_ = -1;
  return true;
}

bool model_stage_device::match_training_state(
    const stage_state& state, std::vector<bool>* has_gradient, std::string* error,
    std::vector<std::pair<const named_tensor*, layers::tensor*>>* copies) {
  for (const named_tensor& gradient : state.gradients) {
    const size_t i = index_of(gradient.name);
    if (i == names_.size() || gradient.dims != parameters_[i]->gradient.dims()) {
      *error = "gradient " + gradient.name + " does not fit this stage";
      return false;
    }
    (*has_gradient)[i] = true;
    copies->push_back({&gradient, &parameters_[i]->gradient});
  }
  for (const named_tensor& extra : state.optimizer_state) {
    bool found = false;
    for (size_t i = 0; i < parameters_.size() && !found; ++i) {
      std::vector<layers::tensor>& tensors = optimizer_->state(i);
      for (size_t k = 0; k < tensors.size() && !found; ++k) {
        if (names_[i] + optimizer_suffix(k) != extra.name) continue;
        if (extra.dims != tensors[k].dims()) break;
        copies->push_back({&extra, &tensors[k]});
        found = true;
      }
    }
    if (!found) {
      *error = "optimizer tensor " + extra.name + " does not fit this stage's " +
               to_string(optimizer_->settings().kind) + " optimizer";
      return false;
    }
  }
  return true;
}

layers::run_options model_stage_device::options_for(const key_message& message,
                                                    bool training) const {
  return {stream_, training ? layers::pass_mode::training : layers::pass_mode::evaluation,
          step_seed(seed_, message.step), static_cast<uint64_t>(message.sample_offset), recompute_};
}

std::vector<layers::tensor> model_stage_device::swap_in_stashed_weights() {
  std::vector<layers::tensor> current;
  if (next_pass_version_ < 0) return current;
  auto found = stash_.find(next_pass_version_);
  next_pass_version_ = -1;
  if (found == stash_.end()) return current;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    current.push_back(parameters_[i]->value);
    parameters_[i]->value = found->second[i];
  }
  return current;
}

void model_stage_device::restore(const std::vector<layers::tensor>& current) {
  for (size_t i = 0; i < parameters_.size(); ++i) parameters_[i]->value = current[i];
}

const char* model_stage_device::optimizer_suffix(size_t k) const {
  const bool adam = optimizer_->settings().kind != layers::optimizer_kind::sgd;
  if (adam) return k == 0 ? ".exp_avg" : ".exp_avg_sq";
  return ".velocity";
}

size_t model_stage_device::index_of(const std::string& name) const {
  return static_cast<size_t>(std::find(names_.begin(), names_.end(), name) - names_.begin());
}

bool model_stage_device::match_weights(
    const std::vector<named_tensor>& tensors, std::string* error,
    std::vector<std::pair<const named_tensor*, layers::tensor*>>* copies) {
  if (tensors.size() != parameters_.size()) {
    *error = std::to_string(tensors.size()) + " weight tensors for a stage with " +
             std::to_string(parameters_.size());
    return false;
  }
  for (const named_tensor& tensor : tensors) {
    const size_t i = index_of(tensor.name);
    if (i == names_.size()) {
      *error = "weight " + tensor.name + " is not a parameter of this stage";
      return false;
    }
    layers::tensor* into = &parameters_[i]->value;
    if (tensor.dims != into->dims()) {
      *error = "weight " + tensor.name + " has shape " + layers::to_string(tensor.dims) +
               " but the model's is " + layers::to_string(into->dims());
      return false;
    }
    copies->push_back({&tensor, into});
  }
  return true;
}

}  // namespace troupe::actors
