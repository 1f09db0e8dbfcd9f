#pragma once

// Jobs and reference results shared by the engine's test suites.

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/learning_rate.h"
#include "actors/engine/sequential_trainer.h"
#include "layers/backend_registry.h"

namespace troupe::testing {

inline layers::layer_spec block(const std::string& type, int out = 0) {
  layers::layer_spec spec;
  spec.type = type;
  spec.out = out;
  return spec;
}

/// A node of a model graph (model.nodes): its blocks, route, emit and next node.
inline actors::graph_node_spec graph_node(std::string name, std::vector<layers::layer_spec> blocks,
                                          actors::node_route route, actors::node_emit emit,
                                          std::string next) {
  actors::graph_node_spec spec;
  spec.name = std::move(name);
  spec.layers = std::move(blocks);
  spec.route = route;
  spec.emit = emit;
  spec.next = std::move(next);
  return spec;
}

/// A small synthetic job (8 blocks, 4 classes) with every kind of activation and dropout.
inline actors::job_config small_pipeline_job(int stages, int micro_batches,
                                             actors::pipeline_mode mode,
                                             actors::pipeline_schedule schedule,
                                             int64_t train_samples) {
  actors::job_config config;
  config.model.input_shape = {12};
  layers::layer_spec dropout = block("dropout");
  dropout.probability = 0.2f;
  config.model.layers = {block("linear", 24), block("tanh"),     dropout,
                         block("linear", 20), block("relu"),     block("linear", 16),
                         block("gelu"),       block("linear", 4)};
  config.data.dataset = troupe::actors::dataset_kind::synthetic;
  config.data.synthetic_train = train_samples;
  config.data.synthetic_test = 100;
  config.data.classes = 4;
  config.training.batch_size = 16;
  config.training.lr = 0.05;
  config.training.momentum = 0.9;
  config.training.weight_decay = 0.001;
  config.training.lr_schedule = troupe::actors::lr_schedule_kind::cosine;
  config.parallelism.stages = stages;
  config.parallelism.micro_batches = micro_batches;
  config.parallelism.mode = mode;
  config.parallelism.schedule = schedule;
  config.parallelism.partition = "uniform";
  return config;
}

/// The Fashion-MNIST MLP of apps/examples/fashion_mlp.toml (784-1024-1024-1024-10, dropout 0.2)
/// on `stages` stages cut by `partition`.
inline actors::job_config fashion_mlp_job(int stages, const std::string& partition) {
  actors::job_config config;
  config.model.input_shape = {1, 28, 28};
  layers::layer_spec dropout = block("dropout");
  dropout.probability = 0.2f;
  config.model.layers = {block("flatten")};
  for (int i = 0; i < 3; ++i) {
    config.model.layers.insert(config.model.layers.end(),
                               {block("linear", 1024), block("relu"), dropout});
  }
  config.model.layers.push_back(block("linear", 10));
  config.parallelism.stages = stages;
  config.parallelism.partition = partition;
  return config;
}

using weights = std::vector<std::vector<float>>;

/// The sequential trainer's weights after `steps` whole-batch steps of `config` (its
/// [parallelism] ignored) in the job's data order, with the schedule planned for `steps`, on
/// `device_name` ("cpu" with one thread, or "cuda").
inline weights sequential_weights(actors::job_config config, const layers::dataset& data,
                                  int64_t steps, const std::string& device_name = "cpu") {
  config.parallelism.stages = 1;
  config.parallelism.micro_batches = 1;
  std::string error;
  auto device = layers::create_backend(device_name, 1, &error);
  actors::sequential_trainer trainer(config, *device);
  layers::batch_order order(data.count(), config.training.batch_size, config.training.seed,
                            config.data.shuffle, true);
  const int64_t per_epoch = order.batches_per_epoch();
  std::vector<float> features(config.training.batch_size * data.sample_size());
  std::vector<int32_t> labels(config.training.batch_size * data.labels_per_sample);
  for (int64_t step = 0; step < steps; ++step) {
    if (step % per_epoch == 0) order.start_epoch(step / per_epoch);
    order.gather(data, step % per_epoch, features.data(), labels.data());
    const double rate = actors::learning_rate_at(config.training, step, per_epoch, steps);
    trainer.train_step(features.data(), labels.data(), config.training.batch_size, step,
                       static_cast<float>(rate));
  }
  weights result;
  for (auto* p : trainer.model().parameters()) {
    result.push_back(p->value.to_host(trainer.work_stream()));
  }
  return result;
}

/// Largest |a - b| over each tensor relative to that tensor's largest |b| (absolute where b is
/// all zeros). NaN, which fails every EXPECT_LE and EXPECT_GT it meets, when the two hold no
/// tensors, tensors of different counts or sizes, or a NaN or an infinity: a comparison of weights
/// that cannot be compared must not pass.
inline double max_relative_difference(const weights& a, const weights& b) {
  const double not_comparable = std::numeric_limits<double>::quiet_NaN();
  if (a.size() != b.size() || b.empty()) return not_comparable;
  double worst = 0;
  for (size_t t = 0; t < b.size(); ++t) {
    if (a[t].size() != b[t].size()) return not_comparable;
    double scale = 0, difference = 0;
    for (size_t i = 0; i < b[t].size(); ++i) {
      const double expected = b[t][i], actual = a[t][i];
      if (!std::isfinite(expected) || !std::isfinite(actual)) return not_comparable;
      scale = std::max(scale, std::fabs(expected));
      difference = std::max(difference, std::fabs(actual - expected));
    }
    worst = std::max(worst, scale > 0 ? difference / scale : difference);
  }
  return worst;
}

}  // namespace troupe::testing
