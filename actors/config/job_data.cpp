#include "actors/config/job_data.h"

#include <unistd.h>

#include <algorithm>

#include "layers/model.h"

namespace troupe::actors {
namespace {

layers::shape input_shape_of(const job_config& config) {
  return layers::shape(config.model.input_shape.begin(), config.model.input_shape.end());
}

std::optional<job_data> synthetic_data(const job_config& config) {
  const layers::shape sample = input_shape_of(config);
  const data_config& data = config.data;
  job_data result;
  // Both splits share the class prototypes (same seed); the test split draws other samples.
  layers::dataset all = layers::make_synthetic_dataset(data.synthetic_train + data.synthetic_test,
                                                       sample, data.classes, config.training.seed);
  const int64_t size = all.sample_size();
  result.test = all;
  result.test.features.erase(result.test.features.begin(),
                             result.test.features.begin() + data.synthetic_train * size);
  result.test.labels.erase(result.test.labels.begin(),
                           result.test.labels.begin() + data.synthetic_train);
  layers::truncate(all, data.synthetic_train);
  result.train = std::move(all);
  return result;
}

/// The largest token id of `data` (features and labels), or -1 when it holds none.
int64_t largest_token(const layers::dataset& data) {
  int64_t largest = -1;
  for (float id : data.features) largest = std::max<int64_t>(largest, static_cast<int64_t>(id));
  for (int32_t id : data.labels) largest = std::max<int64_t>(largest, id);
  return largest;
}

/// Every embedding and lm_head must cover the data's tokens.
bool check_vocabulary(const job_config& config, const job_data& data, std::string* error) {
  const int64_t largest = std::max(largest_token(data.train), largest_token(data.test));
  for (size_t i = 0; i < config.model.layers.size(); ++i) {
    const layers::layer_spec& spec = config.model.layers[i];
    if (spec.type != "embedding" && spec.type != "lm_head") continue;
    if (spec.vocab > largest) continue;
    *error = "model.layers[" + std::to_string(i) + "] (" + spec.type +
             "): vocab = " + std::to_string(spec.vocab) +
             " is smaller than the data's largest token " + std::to_string(largest) + " + 1 (" +
             config.data.path + " has bytes up to " + std::to_string(largest) +
             "; byte-level text needs vocab = 256)";
    return false;
  }
  return true;
}

}  // namespace

std::optional<job_data> load_job_data(const job_config& config, std::string* error) {
  std::optional<job_data> result;
  if (config.data.dataset == dataset_kind::text) {
    auto text = layers::load_text_dataset(config.data.path, config.data.context,
                                          config.data.validation_fraction, error);
    if (!text) return std::nullopt;
    result = job_data{std::move(text->train), std::move(text->validation)};
    if (!check_vocabulary(config, *result, error)) return std::nullopt;
  } else if (config.data.dataset == dataset_kind::synthetic) {
    result = synthetic_data(config);
  } else {
    auto train = layers::load_idx_dataset(config.data.path, "train", error);
    if (!train) return std::nullopt;
    auto test = layers::load_idx_dataset(config.data.path, "t10k", error);
    if (!test) return std::nullopt;
    result = job_data{std::move(*train), std::move(*test)};
  }
  layers::truncate(result->train, config.data.train_samples);
  layers::truncate(result->test, config.data.test_samples);
  if (result->train.sample_shape != input_shape_of(config)) {
    *error = "model.input_shape is " + layers::to_string(input_shape_of(config)) + " but " +
             to_string(config.data.dataset) + " samples have shape " +
             layers::to_string(result->train.sample_shape);
    return std::nullopt;
  }
  if (config.data.normalize && config.data.dataset != dataset_kind::text) {
    float mean = 0, deviation = 1;
    layers::feature_statistics(result->train, &mean, &deviation);
    layers::standardize(result->train, mean, deviation);
    layers::standardize(result->test, mean, deviation);
  }
  return result;
}

namespace {

/// Bytes of physical memory on this machine.
double physical_memory_bytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

/// Rejects a model whose weights, gradients and optimizer state cannot fit in memory, before
/// anything is allocated.
bool check_model_size(const job_config& config, const std::vector<layers::shape>& shapes,
                      std::string* error) {
  double parameters = 0;
  layers::shape input = input_shape_of(config);
  for (size_t i = 0; i < shapes.size(); ++i) {
    parameters += static_cast<double>(layers::parameter_count(config.model.layers[i], input));
    input = shapes[i];
  }
  // Weights, gradients and up to two optimizer tensors, four bytes each.
  const double bytes = parameters * 4 * 4;
  if (bytes > physical_memory_bytes()) {
    *error = "model.layers: " + std::to_string(static_cast<int64_t>(parameters)) +
             " parameters need " + std::to_string(static_cast<int64_t>(bytes / 1e9)) +
             " GB for weights, gradients and optimizer state, more than this machine's memory";
    return false;
  }
  return true;
}

}  // namespace

bool check_model(const job_config& config, int classes, std::string* error) {
  auto shapes = layers::infer_shapes(config.model.layers, input_shape_of(config), error);
  if (!shapes || !check_model_size(config, *shapes, error)) return false;
  const layers::shape& last = shapes->back();
  if (config.data.dataset == dataset_kind::text) {
    if (last.size() == 2 && last[0] == config.data.context) return true;
    *error = "model.layers: the last block must output one score per token of the vocabulary, [" +
             std::to_string(config.data.context) + ", vocab] (an lm_head), but outputs " +
             layers::to_string(last);
    return false;
  }
  if (last.size() != 1 || last[0] != classes) {
    *error = "model.layers: the last block must output one score per class, [" +
             std::to_string(classes) + "], but outputs " + layers::to_string(last);
    return false;
  }
  return true;
}

}  // namespace troupe::actors
