#include "layers/layer_registry.h"

#include <algorithm>
#include <map>

namespace troupe::layers {
namespace {

std::map<std::string, custom_layer_type>& registry() {
  static std::map<std::string, custom_layer_type> types;
  return types;
}

}  // namespace

const std::vector<std::string>& built_in_layer_types() {
  static const std::vector<std::string> names = {"linear",
                                                 "relu",
                                                 "tanh",
                                                 "gelu",
                                                 "conv2d",
                                                 "maxpool2d",
                                                 "flatten",
                                                 "dropout",
                                                 "embedding",
                                                 "layernorm",
                                                 "transformer_block",
                                                 "lm_head",
                                                 "lstm_cell",
                                                 "tree_lstm_cell"};
  return names;
}

bool register_layer_type(const std::string& name, custom_layer_type type, std::string* error) {
  const auto& built_in = built_in_layer_types();
  if (name.empty()) {
    *error = "a layer type needs a name";
  } else if (std::find(built_in.begin(), built_in.end(), name) != built_in.end() ||
             name == "linear_head" || name == "linear_tail" || name == "conv2d_head" ||
             name == "conv2d_tail") {
    // The last four are the parts of a layer that a partition cuts.
    *error = "layer type '" + name + "' is built in";
  } else if (registry().count(name)) {
    *error = "layer type '" + name + "' is already registered";
  } else if (!type.output_shape || !type.make) {
    *error = "layer type '" + name + "' needs output_shape and make";
  } else {
    registry().emplace(name, std::move(type));
    return true;
  }
  return false;
}

const custom_layer_type* find_custom_layer_type(const std::string& name) {
  const auto found = registry().find(name);
  return found == registry().end() ? nullptr : &found->second;
}

std::vector<std::string> layer_type_names() {
  std::vector<std::string> names = built_in_layer_types();
  for (const auto& [name, type] : registry()) names.push_back(name);
  return names;
}

}  // namespace troupe::layers
