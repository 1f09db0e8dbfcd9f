#include "layers/optimizer.h"

#include <cmath>

#include "layers/check.h"

namespace troupe::layers {

optimizer::optimizer(stream s, optimizer_settings settings, std::vector<parameter*> parameters)
    : settings_(std::move(settings)), parameters_(std::move(parameters)) {
  size_t tensors = adam_family() ? 2 : (settings_.momentum != 0.0f ? 1 : 0);
  for (parameter* p : parameters_) {
    std::vector<tensor> state;
    for (size_t i = 0; i < tensors; ++i) {
      state.push_back(tensor::filled(p->value.device(), s, p->value.dims(), 0.0f));
    }
    state_.push_back(std::move(state));
  }
}

void optimizer::step(stream s, float learning_rate, float gradient_scale, float momentum) {
  ++steps_;
  const bool nadam = adam_family() && settings_.nesterov;
  const float beta1 = nadam && momentum >= 0.0f ? momentum : settings_.beta1;
  if (nadam) momentum_product_ *= beta1;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    parameter& p = *parameters_[i];
    if (!p.has_gradient) continue;
    backend& device = p.value.device();
    if (settings_.kind == optimizer_kind::sgd) {
      float* velocity = state_[i].empty() ? nullptr : state_[i][0].data();
      const bool override = velocity != nullptr && momentum >= 0.0f;
      const float used_momentum = override ? momentum : settings_.momentum;
      const float weight = override ? (1.0f - momentum) / (1.0f - settings_.momentum) : 1.0f;
      sgd_parameters sgd{learning_rate, used_momentum, weight * settings_.weight_decay,
                         weight * gradient_scale, settings_.nesterov};
      device.sgd_step(s, p.value.data(), p.gradient.data(), velocity, p.value.size(), sgd);
    } else {
      // PyTorch's AdamW: w *= 1 - lr * weight_decay, then Adam without decay.
      const bool decoupled = settings_.kind == optimizer_kind::adamw;
      adam_parameters adam{learning_rate,
                           beta1,
                           settings_.beta2,
                           settings_.epsilon,
                           decoupled ? 0.0f : settings_.weight_decay,
                           gradient_scale,
                           steps_,
                           decoupled ? learning_rate * settings_.weight_decay : 0.0f,
                           nadam,
                           momentum_product_};
      device.adam_step(s, p.value.data(), p.gradient.data(), state_[i][0].data(),
                       state_[i][1].data(), p.value.size(), adam);
    }
    p.has_gradient = false;
  }
}

void optimizer::set_steps_taken(int64_t steps) {
  steps_ = steps;
  momentum_product_ = std::pow(static_cast<double>(settings_.beta1), static_cast<double>(steps));
}

float clip_scale(double norm_squared, double clip_norm) {
  if (clip_norm <= 0 || norm_squared <= clip_norm * clip_norm) return 1.0f;
  return static_cast<float>(clip_norm / std::sqrt(norm_squared));
}

double optimizer::squared_gradient_norm(stream s, float gradient_scale) {
  if (parameters_.empty()) return 0;
  // Each tensor's sum of squares on the device, all read back at once.
  backend& device = parameters_.front()->gradient.device();
  tensor sums = tensor::filled(device, s, {static_cast<int64_t>(parameters_.size())}, 0.0f);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const parameter& p = *parameters_[i];
    if (!p.has_gradient) continue;
    tensor squares(device, p.gradient.dims());
    device.multiply(s, p.gradient.data(), p.gradient.data(), squares.data(), squares.size());
    device.sum(s, squares.data(), squares.size(), sums.data() + i);
  }
  double total = 0;
  for (float sum : sums.to_host(s)) total += static_cast<double>(sum);
  return total * static_cast<double>(gradient_scale) * gradient_scale;
}

}  // namespace troupe::layers
