#include "actors/storage/model_weights.h"

#include <cctype>
#include <unordered_map>

#include "actors/config/layer_cuts.h"
#include "actors/engine/partition.h"
#include "actors/engine/stage_device.h"
#include "actors/storage/safetensors.h"
#include "layers/backend_registry.h"

namespace troupe::actors {
namespace {

/// "stage3.linear2.weight" → "linear2.weight"; any other name unchanged.
std::string without_stage_prefix(const std::string& name) {
  if (name.rfind("stage", 0) != 0) return name;
  size_t digits = 5;
  while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
  if (digits == 5 || digits >= name.size() || name[digits] != '.') return name;
  return name.substr(digits + 1);
}

/// The tensors of a file by full name and by name without a stage prefix.
class tensor_lookup {
 public:
  explicit tensor_lookup(const std::vector<named_tensor>& tensors) : tensors_(tensors) {
    used_.assign(tensors.size(), false);
    for (size_t i = 0; i < tensors.size(); ++i) {
      by_name_.emplace(tensors[i].name, i);
      by_layer_name_[without_stage_prefix(tensors[i].name)].push_back(i);
    }
  }

  /// Stage `stage`'s parameter `name`: "stage{stage}.{name}", else "{name}", else the one tensor
  /// "stage{k}.{name}". Null, with `error` set, when there is none or several.
  const named_tensor* find(int32_t stage, const std::string& name, std::string* error) {
    const std::string prefixed = "stage" + std::to_string(stage) + "." + name;
    auto exact = by_name_.find(prefixed);
    if (exact == by_name_.end()) exact = by_name_.find(name);
    if (exact != by_name_.end()) return take(exact->second);
    const std::vector<size_t>& others = by_layer_name_[name];
    if (others.size() == 1) return take(others[0]);
    if (others.empty()) {
      *error = "the file has no tensor " + prefixed + " (nor " + name + ")";
    } else {
      *error = "tensors " + tensors_[others[0]].name + " and " + tensors_[others[1]].name +
               " both claim to be " + name;
    }
    return nullptr;
  }

  /// The tensors no parameter took, named (at most ten).
  std::string unused() const {
    std::string names;
    size_t count = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (used_[i]) continue;
      if (++count <= 10) names += (count > 1 ? ", " : "") + tensors_[i].name;
    }
    if (count > 10) names += " and " + std::to_string(count - 10) + " more";
    return names;
  }

 private:
  const named_tensor* take(size_t index) {
    used_[index] = true;
    return &tensors_[index];
  }

  const std::vector<named_tensor>& tensors_;
  std::vector<bool> used_;
  std::unordered_map<std::string, size_t> by_name_;
  std::unordered_map<std::string, std::vector<size_t>> by_layer_name_;
};

/// `parameter` from `lookup`; a part of a cut layer (`rows`: its first row and the whole
/// layer's rows, or null) takes its rows of a whole-layer tensor.
bool fill_parameter(tensor_lookup& lookup, int32_t stage, named_tensor* parameter,
                    const std::pair<int64_t, int64_t>* rows, std::string* error) {
  const named_tensor* source = lookup.find(stage, parameter->name, error);
  if (source == nullptr) return false;
  layers::shape whole = parameter->dims;
  if (rows != nullptr && !whole.empty()) whole[0] = rows->second;
  if (rows != nullptr && source->dims == whole &&
      static_cast<int64_t>(source->values.size()) == layers::element_count(whole)) {
    const int64_t width = layers::element_count(whole) / whole[0];
    const auto begin = source->values.begin() + rows->first * width;
    parameter->values.assign(begin, begin + layers::element_count(parameter->dims));
    return true;
  }
  if (source->dims != parameter->dims) {
    *error = "tensor " + source->name + " has shape " + layers::to_string(source->dims) +
             " but the model's is " + layers::to_string(parameter->dims);
    return false;
  }
  if (static_cast<int64_t>(source->values.size()) != layers::element_count(source->dims)) {
    *error = "tensor " + source->name + " holds " + std::to_string(source->values.size()) +
             " values for shape " + layers::to_string(source->dims);
    return false;
  }
  parameter->values = source->values;
  return true;
}

}  // namespace

std::vector<named_tensor> export_tensors(const std::vector<stage_state>& stages) {
  std::vector<named_tensor> tensors;
  for (const stage_state& state : stages) {
    const std::string prefix = "stage" + std::to_string(state.stage) + ".";
    for (const named_tensor& parameter : state.parameters) {
      tensors.push_back({prefix + parameter.name, parameter.dims, parameter.values});
    }
  }
  return tensors;
}

std::optional<std::vector<stage_state>> seeded_stage_states(const job_config& config,
                                                            std::string* error) {
  auto ranges = partition_model(config, error);
  if (!ranges) return std::nullopt;
  auto backend = layers::create_backend("cpu", 1, error);
  if (!backend) return std::nullopt;
  std::vector<stage_state> states;
  for (size_t i = 0; i < ranges->size(); ++i) {
    stage_state state;
    state.stage = static_cast<int32_t>(i);
    state.stages = static_cast<int32_t>(ranges->size());
    state.first_block = static_cast<int64_t>((*ranges)[i].first);
    state.last_block = static_cast<int64_t>((*ranges)[i].last);
    state.parameters =
        make_layers_stage_device(config, (*ranges)[i], *backend)->save_state().parameters;
    states.push_back(std::move(state));
  }
  return states;
}

std::optional<std::vector<stage_state>> stage_states_from_tensors(
    const std::vector<named_tensor>& tensors, const job_config& config, std::string* error) {
  auto states = seeded_stage_states(config, error);
  if (!states) return std::nullopt;
  tensor_lookup lookup(tensors);
  for (stage_state& state : *states) {
    const auto cut_rows = cut_layer_rows(config, static_cast<size_t>(state.first_block),
                                         static_cast<size_t>(state.last_block));
    for (named_tensor& parameter : state.parameters) {
      const auto rows = cut_rows.find(parameter.name.substr(0, parameter.name.find('.')));
      const auto* part = rows == cut_rows.end() ? nullptr : &rows->second;
      if (!fill_parameter(lookup, state.stage, &parameter, part, error)) return std::nullopt;
    }
  }
  const std::string unused = lookup.unused();
  if (!unused.empty()) {
    *error = "tensors that are not parameters of the model: " + unused;
    return std::nullopt;
  }
  return states;
}

std::optional<std::vector<stage_state>> initial_stage_states(const job_config& config,
                                                             std::string* error) {
  const std::string& path = config.model.init_from;
  std::string problem;
  auto tensors = read_safetensors(path, &problem);
  if (!tensors) {
    // read_safetensors names the file itself.
    *error = "model.init_from: " + problem;
    return std::nullopt;
  }
  auto states = stage_states_from_tensors(*tensors, config, &problem);
  if (!states) *error = "model.init_from: " + path + ": " + problem;
  return states;
}

}  // namespace troupe::actors
