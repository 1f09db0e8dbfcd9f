#include "layers/optimizer.h"

#include "layers/check.h"

namespace troupe::layers {

optimizer::optimizer(stream s, optimizer_settings settings, std::vector<parameter*> parameters)
    : settings_(std::move(settings)), parameters_(std::move(parameters)) {
  TROUPE_CHECK(settings_.kind == "sgd" || adam_family());
  size_t tensors = adam_family() ? 2 : (settings_.momentum != 0.0f ? 1 : 0);
  for (parameter* p : parameters_) {
    std::vector<tensor> state;
    for (size_t i = 0; i < tensors; ++i) {
      state.push_back(tensor::filled(p->value.device(), s, p->value.dims(), 0.0f));
    }
    state_.push_back(std::move(state));
  }
}

void optimizer::step(stream s, float learning_rate, float gradient_scale) {
  ++steps_;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    parameter& p = *parameters_[i];
    if (!p.has_gradient) continue;
    backend& device = p.value.device();
    if (settings_.kind == "sgd") {
      sgd_parameters sgd{learning_rate, settings_.momentum, settings_.weight_decay, gradient_scale};
      float* velocity = state_[i].empty() ? nullptr : state_[i][0].data();
      device.sgd_step(s, p.value.data(), p.gradient.data(), velocity, p.value.size(), sgd);
    } else {
      const bool decoupled = settings_.kind == "adamw";
      if (decoupled && settings_.weight_decay != 0.0f) {
        // PyTorch's AdamW: w *= 1 - lr * weight_decay, then Adam without decay.
        device.axpy(s, -learning_rate * settings_.weight_decay, p.value.data(), p.value.data(),
                    p.value.size());
      }
      adam_parameters adam{learning_rate,
                           settings_.beta1,
                           settings_.beta2,
                           settings_.epsilon,
                           decoupled ? 0.0f : settings_.weight_decay,
                           gradient_scale,
                           steps_};
      device.adam_step(s, p.value.data(), p.gradient.data(), state_[i][0].data(),
                       state_[i][1].data(), p.value.size(), adam);
    }
    p.has_gradient = false;
  }
}

double optimizer::squared_gradient_norm(stream s, float gradient_scale) {
  double total = 0;
  for (parameter* p : parameters_) {
    if (!p->has_gradient) continue;
    backend& device = p->gradient.device();
    tensor squares(device, p->gradient.dims());
    tensor sum(device, {1});
    device.multiply(s, p->gradient.data(), p->gradient.data(), squares.data(), squares.size());
    device.sum(s, squares.data(), squares.size(), sum.data());
    total += static_cast<double>(sum.to_host(s)[0]);
  }
  return total * static_cast<double>(gradient_scale) * gradient_scale;
}

}  // namespace troupe::layers
