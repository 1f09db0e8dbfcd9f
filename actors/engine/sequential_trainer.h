#pragma once

// The single-stage trainer: plain mini-batch training of the whole model on one backend. It
// is the exact reference that pipelined training (sync mode, async with one active key) must
// reproduce, step for step.

#include <cstdint>
#include <memory>

#include "actors/config/job_config.h"
#include "layers/dataset.h"
#include "layers/loss.h"
#include "layers/model.h"
#include "layers/optimizer.h"

namespace troupe::actors {

/// Totals of one training step or one evaluation pass.
struct batch_totals {
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t samples = 0;

  void add(const batch_totals& other) {
    loss_sum += other.loss_sum;
    correct += other.correct;
    samples += other.samples;
  }
  double mean_loss() const { return samples ? loss_sum / samples : 0.0; }
  double accuracy() const { return samples ? static_cast<double>(correct) / samples : 0.0; }
};

/// Optimizer settings of a job's [training] section.
layers::optimizer_settings optimizer_settings_of(const training_config& training);

/// The dropout stream of optimizer step `step`.
uint64_t step_seed(uint64_t job_seed, int64_t step);

class sequential_trainer {
 public:
  /// Builds the model of `config` (whose layer shapes must chain) on `device`, working on a
  /// stream of its own whose GEMMs run at config.training.precision.
  sequential_trainer(const job_config& config, layers::backend& device);
  /// Waits for the trainer's stream, then destroys it.
  ~sequential_trainer();
  sequential_trainer(const sequential_trainer&) = delete;
  sequential_trainer& operator=(const sequential_trainer&) = delete;

  /// One optimizer step on a batch of `samples` host samples; `step` counts from 0.
  batch_totals train_step(const float* features, const int32_t* labels, int64_t samples,
                          int64_t step, float learning_rate);
  /// Forward-only pass over a whole data set in batches of `batch_size`.
  batch_totals evaluate(const layers::dataset& data, int64_t batch_size);

  layers::sequential& model() { return *model_; }
  /// Labels per sample: 1 for a classifier, T for a language model over T tokens.
  int64_t labels_per_sample() const { return layers::labels_per_sample(model_->output_shape()); }
  layers::optimizer& optimizer() { return *optimizer_; }
  layers::backend& device() { return device_; }
  /// The stream all of the trainer's work runs on; read its tensors through it.
  layers::stream work_stream() const { return stream_; }

 private:
  /// Copies a host batch to the device tensors sized for `samples`.
  void upload(const float* features, const int32_t* labels, int64_t samples);

  layers::backend& device_;
  layers::stream stream_;
  uint64_t seed_;
  double clip_norm_;  ///< global: the norm of every parameter's gradient together
  std::unique_ptr<layers::sequential> model_;
  std::unique_ptr<layers::optimizer> optimizer_;
  layers::tensor input_;
  layers::int_tensor labels_;
};

}  // namespace troupe::actors
