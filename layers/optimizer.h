#pragma once

// Optimizers over a fixed list of parameters, with PyTorch's update rules (see backend.h).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers/layer.h"
#include "layers/optimizer_kind.h"

namespace troupe::layers {

struct optimizer_settings {
  optimizer_kind kind = optimizer_kind::sgd;
  float momentum = 0.0f;
  /// Nesterov's look-ahead: SGD's (PyTorch's nesterov=True), or Adam's as NAdam
  /// (adam_parameters::nesterov).
  bool nesterov = false;
  float weight_decay = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

/// The factor that scales gradients of squared L2 norm `norm_squared` down to `clip_norm`
/// (PyTorch's clip_grad_norm_): clip_norm / norm when larger, else 1; 1 when clip_norm is 0.
float clip_scale(double norm_squared, double clip_norm);

class optimizer {
 public:
  /// State (velocity, moments) is allocated on the parameters' device, zeroed, on `s`.
  optimizer(stream s, optimizer_settings settings, std::vector<parameter*> parameters);

  /// Applies one update at `learning_rate` to every parameter that received gradients since
  /// the last step, multiplying those gradients by `gradient_scale` first, then marks them
  /// consumed (the next backward overwrites instead of adding). SGD with momentum takes
  /// `momentum` for this step where it is given (≥ 0), else the settings' momentum μ, and
  /// weighs the step's gradient (weight decay included) by (1 − momentum) / (1 − μ): a
  /// steady gradient g still moves the weights by lr · g / (1 − μ) per step, the momentum
  /// only shifting the weight from the new gradient to the buffer, as raising β1 does in Adam.
  /// NAdam (Adam with `nesterov`) takes it as this step's β1.
  void step(stream s, float learning_rate, float gradient_scale = 1.0f, float momentum = -1.0f);

  /// The L2 norm of the gradients accumulated since the last step, times `gradient_scale`,
  /// squared; read on the host (synchronizes `s`).
  double squared_gradient_norm(stream s, float gradient_scale = 1.0f);

  int64_t steps_taken() const { return steps_; }
  /// Restores the step count from a checkpoint (Adam's bias correction depends on it). NAdam's
  /// product of β1 restarts as β1^steps: exact when every step took β1; after steps with the
  /// delay-corrected Nesterov method's raised β1s the true product was larger (a stage at
  /// β1 0.9675 holds 0.037 after 100 steps against 0.9^100 = 3e-5), so the bias correction of
  /// the next few hundred steps after a resume is up to a few per cent off.
  void set_steps_taken(int64_t steps);
  const optimizer_settings& settings() const { return settings_; }
  /// The state tensors of parameter i (velocity for SGD with momentum; two moments for Adam).
  std::vector<tensor>& state(size_t i) { return state_[i]; }

 private:
  bool adam_family() const { return settings_.kind != optimizer_kind::sgd; }

  optimizer_settings settings_;
  std::vector<parameter*> parameters_;
  std::vector<std::vector<tensor>> state_;
  int64_t steps_ = 0;
  double momentum_product_ = 1;  ///< NAdam's product of β1 over the steps taken
};

}  // namespace troupe::layers
