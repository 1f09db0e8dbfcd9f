#pragma once

// Models the benchmarks train, built in code so that no job file is needed.

#include <vector>

#include "actors/config/job_config.h"

namespace troupe::apps {

/// A job whose model is linear layers of `widths` (input first) with ReLU between them,
/// trained with SGD and momentum 0.9 at batch `batch`.
inline actors::job_config mlp_job(const std::vector<int>& widths, int64_t batch) {
  actors::job_config config;
  config.model.input_shape = {widths.front()};
  for (size_t i = 1; i < widths.size(); ++i) {
    layers::layer_spec linear;
    linear.type = "linear";
    linear.out = widths[i];
    config.model.layers.push_back(linear);
    layers::layer_spec relu;
    relu.type = "relu";
    if (i + 1 < widths.size()) config.model.layers.push_back(relu);
  }
  config.training.batch_size = batch;
  config.training.optimizer = layers::optimizer_kind::sgd;
  config.training.momentum = 0.9;
  config.training.lr = 0.01;
  return config;
}

}  // namespace troupe::apps
