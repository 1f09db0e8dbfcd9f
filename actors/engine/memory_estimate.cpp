#include "actors/engine/memory_estimate.h"

#include <cstdio>

#include "actors/engine/stage_settings.h"
#include "layers/layer.h"
#include "layers/model.h"

namespace troupe::actors {
namespace {

/// Optimizer tensors per parameter: a velocity (SGD with momentum) or Adam's two moments.
double optimizer_tensors(const training_config& training) {
  if (training.optimizer != layers::optimizer_kind::sgd) return 2;
  return training.momentum != 0 ? 1 : 0;
}

/// A GPT block over T tokens of width D (H heads, MLP ratio r) keeps its input, the attention's
/// queries, keys, values and output, both layer norms, the MLP's two activations, the H·T×T
/// probabilities and, with dropout, its masks; under recompute only its input.
int64_t transformer_context(const layers::layer_spec& spec, const layers::shape& input,
                            bool recompute) {
  const double t = static_cast<double>(input[0]), d = static_cast<double>(input[1]);
  const double scores = spec.heads * t * t;
  const double kept =
      t * d * (8 + 2 * spec.mlp_ratio) + scores + (spec.dropout > 0 ? 2 * t * d : 0);
  return static_cast<int64_t>(recompute ? t * d : kept);
}

/// Whether every stage runs on the CPU, in this machine's memory.
bool stages_on_host(const job_config& config) {
  for (const std::string& device : config.parallelism.devices) {
    if (device.rfind("cuda", 0) == 0) return false;
  }
  return true;
}

std::string gigabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GB", bytes / 1e9);
  return text;
}

/// The keys that shrink the estimate's largest part.
std::string keys_to_change(const memory_estimate& estimate) {
  if (estimate.key_bytes >= estimate.state_bytes && estimate.key_bytes >= estimate.data_bytes) {
    return "lower training.batch_size (or raise parallelism.micro_batches) or shrink "
           "model.input_shape";
  }
  if (estimate.data_bytes >= estimate.state_bytes) {
    return "lower data.synthetic_train and data.synthetic_test or shrink model.input_shape";
  }
  return "shrink model.layers";
}

}  // namespace

block_memory memory_of_block(const layers::layer_spec& spec, const layers::shape& input,
                             const layers::shape& output, const job_config& job) {
  block_memory memory;
  memory.parameters = layers::parameter_count(spec, input);
  const double parameter_bytes = value_bytes * static_cast<double>(memory.parameters);
  memory.state_bytes = parameter_bytes * (2 + optimizer_tensors(job.training));
  if (spec.type == "transformer_block") {
    memory.context_elements = transformer_context(spec, input, job.parallelism.recompute);
  } else if (layers::uncut_type(spec.type) == "conv2d") {
    // im2col + GEMM: the context keeps the unfolded input, channels · k² values per output
    // pixel (a cut part's own channels; it keeps the image's size).
    const bool tail = layers::is_cut_tail(spec.type);
    const int64_t channels = input[0] - (tail ? spec.split : 0);
    const int64_t pixels = output[1] * output[2];
    memory.context_elements = channels * spec.kernel * spec.kernel * pixels;
  } else if (spec.type == "embedding") {
    memory.context_elements = layers::element_count(input);  // the token ids
  } else {
    memory.context_elements = layers::element_count(output);
  }
  return memory;
}

std::optional<memory_estimate> estimate_memory(const job_config& config, std::string* error) {
  const layers::shape input_shape = config.model.input_shape;
  auto shapes = layers::infer_shapes(config.model.layers, input_shape, error);
  if (!shapes) return std::nullopt;
  memory_estimate estimate;
  estimate.key_samples = micro_batch_size(config);
  const double replicas = config.parallelism.replicas;
  layers::shape input = input_shape;
  for (size_t i = 0; i < shapes->size(); ++i) {
    const block_memory block = memory_of_block(config.model.layers[i], input, (*shapes)[i], config);
    estimate.state_bytes += replicas * block.state_bytes;
    estimate.key_bytes += replicas * value_bytes * static_cast<double>(block.context_elements) *
                          static_cast<double>(estimate.key_samples);
    input = (*shapes)[i];
  }
  if (config.data.dataset == dataset_kind::synthetic) {
    const double samples =
        static_cast<double>(config.data.synthetic_train + config.data.synthetic_test);
    estimate.data_bytes =
        value_bytes * static_cast<double>(layers::element_count(input_shape)) * samples;
  }
  return estimate;
}

bool check_memory(const job_config& config, double available_bytes, std::string* error) {
  auto estimate = estimate_memory(config, error);
  if (!estimate) return false;
  if (!stages_on_host(config)) {
    // A GPU holds its stages' weights and activations; running out there is reported where it
    // happens (layers::out_of_memory). Only the data counts against this machine's memory.
    estimate->state_bytes = estimate->key_bytes = 0;
  }
  if (estimate->total_bytes() <= available_bytes) return true;
  const std::string replicas =
      config.parallelism.replicas > 1
          ? " in each of " + std::to_string(config.parallelism.replicas) + " replicas"
          : "";
  *error = "the job needs at least " + gigabytes(estimate->total_bytes()) + " of memory (" +
           gigabytes(estimate->key_bytes) + " of activations for one key of " +
           std::to_string(estimate->key_samples) + " samples" + replicas + ", " +
           gigabytes(estimate->state_bytes) + " of weights, gradients and optimizer state, " +
           gigabytes(estimate->data_bytes) + " of data) but this machine has " +
           gigabytes(available_bytes) + " available: " + keys_to_change(*estimate);
  return false;
}

}  // namespace troupe::actors
