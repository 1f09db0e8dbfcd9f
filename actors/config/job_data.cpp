#include "actors/config/job_data.h"

#include <unistd.h>

#include <algorithm>

#include "actors/config/model_graph_checks.h"
#include "layers/listops.h"
#include "layers/model.h"
#include "layers/text_records.h"

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

/// One split of a dynamic model's data as a data set of instances, the first `keep` of them
/// (all when keep <= 0).
layers::dataset instance_split(layers::instance_dataset split, int64_t keep) {
  if (keep > 0 && keep < split.count()) split.instances.resize(static_cast<size_t>(keep));
  layers::dataset result;
  result.name = split.name;
  result.sample_shape = {1};
  result.classes = split.classes;
  result.instances = std::make_shared<const layers::instance_dataset>(std::move(split));
  return result;
}

/// Every embedding of the graph must cover the data's tokens.
bool check_graph_vocabulary(const job_config& config, int vocabulary, std::string* error) {
  for (size_t n = 0; n < config.model.nodes.size(); ++n) {
    const graph_node_spec& node = config.model.nodes[n];
    for (size_t i = 0; i < node.layers.size(); ++i) {
      const layers::layer_spec& spec = node.layers[i];
      if (spec.type != "embedding" || spec.vocab >= vocabulary) continue;
      *error = "model.nodes[" + std::to_string(n) + "] (\"" + node.name + "\") layers[" +
               std::to_string(i) + "] (embedding): vocab = " + std::to_string(spec.vocab) +
               " is smaller than the " + to_string(config.data.dataset) + " data's " +
               std::to_string(vocabulary) + " tokens";
      return false;
    }
  }
  return true;
}

/// The most parts any instance of `splits` has.
int64_t longest_instance(const layers::instance_splits& splits) {
  int64_t longest = 0;
  for (const layers::instance_dataset* split : {&splits.train, &splits.validation}) {
    for (const layers::instance& item : split->instances) longest = std::max(longest, item.parts());
  }
  return longest;
}

/// Every embedding of the graph with explicit positions counts them from 0 in each instance, so
/// it needs as many as the longest instance has parts.
bool check_graph_positions(const job_config& config, int64_t longest, std::string* error) {
  for (size_t n = 0; n < config.model.nodes.size(); ++n) {
    const graph_node_spec& node = config.model.nodes[n];
    for (size_t i = 0; i < node.layers.size(); ++i) {
      const layers::layer_spec& spec = node.layers[i];
      if (spec.type != "embedding" || spec.positions <= 0 || spec.positions >= longest) continue;
      *error = "model.nodes[" + std::to_string(n) + "] (\"" + node.name + "\") layers[" +
               std::to_string(i) + "] (embedding): positions = " + std::to_string(spec.positions) +
               ", but the " + to_string(config.data.dataset) + " data has instances of " +
               std::to_string(longest) +
               " parts (data.context = " + std::to_string(config.data.context) +
               "), and positions count from 0 in each instance: raise positions or lower "
               "data.context";
      return false;
    }
  }
  return true;
}

/// ListOps generated, or text records read, as instances (layers/instance.h).
std::optional<job_data> instance_data(const job_config& config, std::string* error) {
  const data_config& data = config.data;
  std::optional<layers::instance_splits> splits;
  if (data.dataset == dataset_kind::listops) {
    layers::listops_options options;
    options.train_count = data.synthetic_train;
    options.test_count = data.synthetic_test;
    options.max_depth = data.max_depth;
    options.max_arguments = data.max_arguments;
    options.max_tokens = data.context;
    options.seed = data.seed;
    splits = layers::generate_listops(options, error);
  } else {
    splits = layers::load_text_records(data.path, data.context, data.validation_fraction, error);
  }
  if (!splits || !check_graph_vocabulary(config, splits->train.vocabulary, error) ||
      !check_graph_positions(config, longest_instance(*splits), error))
    return std::nullopt;
  return job_data{instance_split(std::move(splits->train), data.train_samples),
                  instance_split(std::move(splits->validation), data.test_samples)};
}

}  // namespace

std::optional<job_data> load_job_data(const job_config& config, std::string* error) {
  if (config.data.dataset == dataset_kind::listops ||
      config.data.dataset == dataset_kind::text_records) {
    return instance_data(config, error);
  }
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
  if (result->test.count() == 0) {
    // Every epoch ends with an evaluation: with nothing to evaluate the run would never end.
    *error = std::string("the ") + to_string(config.data.dataset) +
             " data's test split holds no samples (raise data.validation_fraction, or "
             "data.test_samples to 1 or more)";
    return std::nullopt;
  }
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
/// anything is allocated; `what` names the model's key.
bool check_parameter_memory(double parameters, const std::string& what, std::string* error) {
  // Weights, gradients and up to two optimizer tensors, four bytes each.
  const double bytes = parameters * 4 * 4;
  if (bytes > physical_memory_bytes()) {
    *error = what + ": " + std::to_string(static_cast<int64_t>(parameters)) + " parameters need " +
             std::to_string(static_cast<int64_t>(bytes / 1e9)) +
             " GB for weights, gradients and optimizer state, more than this machine's memory";
    return false;
  }
  return true;
}

/// The parameters of `specs` on samples of `input`, whose outputs are `shapes`.
double parameters_of(const std::vector<layers::layer_spec>& specs, layers::shape input,
                     const std::vector<layers::shape>& shapes) {
  double parameters = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    parameters += static_cast<double>(layers::parameter_count(specs[i], input));
    input = shapes[i];
  }
  return parameters;
}

/// The rows that reach the loss must stand for what the data labels: one per instance for
/// listops (each labelled with its root's class), one per part for text-records (each
/// labelled with the token after it).
bool check_graph_loss(const job_config& config, int classes, const graph_node_widths& last,
                      const std::string& label, std::string* error) {
  const dataset_kind data = config.data.dataset;
  if (data == dataset_kind::listops && last.emits_per_part) {
    *error = label + ": listops labels each instance once (its root's value), but the rows " +
             "reaching the loss are one per part: let a loop or tree node emit = \"root\"";
    return false;
  }
  if (data == dataset_kind::text_records && !last.emits_per_part) {
    *error = label + ": text-records labels every part (the token after it), but the rows " +
             "reaching the loss are one per instance: emit = \"every\" on the loop or tree node";
    return false;
  }
  if (data == dataset_kind::listops && last.output != classes) {
    *error = label + ": the last node must output one score per class, " + std::to_string(classes) +
             ", but outputs " + std::to_string(last.output) + " per row";
    return false;
  }
  return true;
}

/// A graph model: its nodes on the data it will get, the rows that reach the loss, and its size.
bool check_graph_model(const job_config& config, int classes, std::string* error) {
  auto widths = model_graph_widths(config, expected_arity(config.data), error);
  if (!widths) return false;
  const std::vector<size_t> order = model_graph_order(config);
  const std::string last = "model.nodes[" + std::to_string(order.back()) + "] (\"" +
                           config.model.nodes[order.back()].name + "\")";
  if (!check_graph_loss(config, classes, (*widths)[order.back()], last, error)) return false;
  double parameters = 0;
  for (size_t i = 0; i < config.model.nodes.size(); ++i) {
    const std::vector<layers::layer_spec>& specs = config.model.nodes[i].layers;
    const layers::shape input = (*widths)[i].blocks_shape();
    auto shapes = layers::infer_shapes(specs, input, error);
    if (!shapes) return false;  // unreachable: model_graph_widths() inferred them
    parameters += parameters_of(specs, input, *shapes);
  }
  return check_parameter_memory(parameters, "model.nodes", error);
}

}  // namespace

bool check_model(const job_config& config, int classes, std::string* error) {
  if (!config.model.nodes.empty()) return check_graph_model(config, classes, error);
  const layers::shape input = input_shape_of(config);
  auto shapes = layers::infer_shapes(config.model.layers, input, error);
  if (!shapes) return false;
  const double parameters = parameters_of(config.model.layers, input, *shapes);
  if (!check_parameter_memory(parameters, "model.layers", error)) return false;
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
