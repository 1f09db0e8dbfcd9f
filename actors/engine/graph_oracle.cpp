#include "actors/engine/graph_oracle.h"

#include "actors/engine/learning_rate.h"
#include "actors/engine/stage_settings.h"
#include "layers/check.h"
#include "layers/loss.h"
#include "layers/optimizer.h"

namespace troupe::actors {

graph_oracle::graph_oracle(const job_config& config, layers::backend& device)
    : config_(config), device_(device), stream_(device.create_stream()) {
  device.set_gemm_precision(stream_, config.training.precision);
  std::string error;
  auto graph = ordered_graph_of(config, &error);
  TROUPE_CHECK(graph.has_value());
  program_ =
      std::make_unique<graph_program>(device, stream_, graph->nodes, graph->widths, 0,
                                      graph->nodes.size(), graph->arity, config.training.seed);
  layers::optimizer_settings settings = optimizer_settings_of(config.training);
  settings.nesterov = settings.nesterov || nesterov_correction(config);
  optimizer_ = std::make_unique<layers::optimizer>(stream_, settings, program_->parameters());
  device.synchronize(stream_);
}

graph_oracle::~graph_oracle() {
  device_.synchronize(stream_);
  device_.destroy_stream(stream_);
}

batch_totals graph_oracle::run_instance(const layers::instance& item, int64_t step, float scale) {
  auto alone = std::make_shared<std::vector<layers::instance>>(1, item);
  std::vector<float> tokens(item.tokens.begin(), item.tokens.end());
  const layers::tensor input =
      layers::tensor::from_host(device_, stream_, {item.parts(), 1}, tokens);
  const layers::run_options options{stream_, layers::pass_mode::training,
                                    step_seed(config_.training.seed, step), 0, false};
  graph_tape tape;
  const layers::tensor logits = program_->forward(options, input, alone, &tape);
  layers::int_tensor labels(device_, static_cast<int64_t>(item.labels.size()));
  labels.copy_from_host(stream_, item.labels.data());
  layers::loss_output loss = layers::softmax_cross_entropy(stream_, logits, labels, scale, true);
  const layers::loss_totals totals = layers::read_totals(stream_, loss);
  program_->backward(options, tape, loss.gradient, false);
  return {totals.loss_sum, totals.correct, layers::counted_labels(item.labels)};
}

batch_totals graph_oracle::train_step(const std::vector<std::vector<layers::instance>>& keys,
                                      int64_t step, float learning_rate) {
  batch_totals totals;
  for (const std::vector<layers::instance>& key : keys) {
    int64_t rows = 0;
    for (const layers::instance& item : key) rows += layers::counted_labels(item.labels);
    const float scale = 1.0f / static_cast<float>(rows * static_cast<int64_t>(keys.size()));
    for (const layers::instance& item : key) totals.add(run_instance(item, step, scale));
  }
  const double clip = config_.training.clip_norm;
  const double norm_squared = clip > 0 ? optimizer_->squared_gradient_norm(stream_) : 0.0;
  optimizer_->step(stream_, learning_rate, layers::clip_scale(norm_squared, clip));
  device_.synchronize(stream_);
  return totals;
}

void graph_oracle::train(const layers::dataset& data, int64_t steps) {
  TROUPE_CHECK(data.instances != nullptr);
  const training_config& training = config_.training;
  layers::batch_order order(data.count(), training.batch_size, training.seed, config_.data.shuffle,
                            true);
  const int64_t per_epoch = order.batches_per_epoch();
  const int64_t micro = micro_batch_size(config_);
  for (int64_t step = 0; step < steps; ++step) {
    if (step % per_epoch == 0) order.start_epoch(step / per_epoch);
    const int64_t first = (step % per_epoch) * training.batch_size;
    std::vector<std::vector<layers::instance>> keys;
    for (int64_t offset = 0; offset < training.batch_size; offset += micro) {
      std::vector<layers::instance>& key = keys.emplace_back();
      for (int64_t i = 0; i < micro; ++i) {
        const int64_t sample = order.order()[static_cast<size_t>(first + offset + i)];
        key.push_back(data.instances->instances[static_cast<size_t>(sample)]);
      }
    }
    train_step(keys, step, static_cast<float>(learning_rate_at(training, step, per_epoch, steps)));
  }
}

}  // namespace troupe::actors
