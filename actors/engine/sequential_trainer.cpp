#include "actors/engine/sequential_trainer.h"

#include <vector>

#include "layers/check.h"
#include "layers/random.h"

namespace troupe::actors {

layers::optimizer_settings optimizer_settings_of(const training_config& training) {
  layers::optimizer_settings settings;
  settings.kind = training.optimizer;
  settings.momentum = static_cast<float>(training.momentum);
  settings.nesterov = training.nesterov;
  settings.weight_decay = static_cast<float>(training.weight_decay);
  settings.beta1 = static_cast<float>(training.beta1);
  settings.beta2 = static_cast<float>(training.beta2);
  settings.epsilon = static_cast<float>(training.epsilon);
  return settings;
}

uint64_t step_seed(uint64_t job_seed, int64_t step) {
  return layers::derive_seed(layers::derive_seed(job_seed, 0x64726f70ULL), step);
}

sequential_trainer::sequential_trainer(const job_config& config, layers::backend& device)
    : device_(device),
      stream_(device.create_stream()),
      seed_(config.training.seed),
      clip_norm_(config.training.clip_norm) {
  device.set_gemm_precision(stream_, config.training.precision);
  const auto& specs = config.model.layers;
  layers::shape input(config.model.input_shape.begin(), config.model.input_shape.end());
  model_ =
      std::make_unique<layers::sequential>(device, stream_, specs, input, 0, specs.size(), seed_);
  optimizer_ = std::make_unique<layers::optimizer>(stream_, optimizer_settings_of(config.training),
                                                   model_->parameters());
}

sequential_trainer::~sequential_trainer() {
  // The model's and optimizer's tensors are freed after this, with no work left that uses them.
  device_.synchronize(stream_);
  device_.destroy_stream(stream_);
}

void sequential_trainer::upload(const float* features, const int32_t* labels, int64_t samples) {
  if (input_.empty() || input_.rows() != samples) {
    layers::shape dims{samples};
    dims.insert(dims.end(), model_->input_shape().begin(), model_->input_shape().end());
    input_ = layers::tensor(device_, dims);
    labels_ = layers::int_tensor(device_, samples * labels_per_sample());
  }
  input_.copy_from_host(stream_, features);
  labels_.copy_from_host(stream_, labels);
}

batch_totals sequential_trainer::train_step(const float* features, const int32_t* labels,
                                            int64_t samples, int64_t step, float learning_rate) {
  upload(features, labels, samples);
  layers::run_options options{stream_, layers::pass_mode::training, step_seed(seed_, step), 0};
  layers::sequential_context context;
  layers::tensor logits = model_->forward(options, input_, &context);
  const float scale = 1.0f / static_cast<float>(samples);
  layers::loss_output loss = layers::softmax_cross_entropy(stream_, logits, labels_, scale, true);
  model_->backward(options, context, loss.gradient, false);
  const double norm_squared = clip_norm_ > 0 ? optimizer_->squared_gradient_norm(stream_) : 0.0;
  optimizer_->step(stream_, learning_rate, layers::clip_scale(norm_squared, clip_norm_));
  layers::loss_totals totals = layers::read_totals(stream_, loss);
  return {totals.loss_sum, totals.correct, samples * labels_per_sample()};
}

batch_totals sequential_trainer::evaluate(const layers::dataset& data, int64_t batch_size) {
  layers::batch_order order(data.count(), batch_size, 0, false, false);
  order.start_epoch(0);
  std::vector<float> features;
  std::vector<int32_t> labels;
  batch_totals result;
  layers::run_options options{stream_, layers::pass_mode::evaluation, 0, 0};
  for (int64_t b = 0; b < order.batches_per_epoch(); ++b) {
    const int64_t samples = order.batch_samples(b);
    features.resize(samples * data.sample_size());
    labels.resize(samples * labels_per_sample());
    order.gather(data, b, features.data(), labels.data());
    upload(features.data(), labels.data(), samples);
    layers::tensor logits = model_->forward(options, input_, nullptr);
    layers::loss_output loss = layers::softmax_cross_entropy(stream_, logits, labels_, 1, false);
    layers::loss_totals totals = layers::read_totals(stream_, loss);
    result.loss_sum += totals.loss_sum;
    result.correct += totals.correct;
    result.samples += samples * labels_per_sample();
  }
  return result;
}

}  // namespace troupe::actors
