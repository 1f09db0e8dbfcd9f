#include "actors/config/job_keys.h"

#include "actors/config/job_schema.h"
#include "actors/config/node_schema.h"
#include "layers/layer_registry.h"

namespace troupe::actors {
namespace {

/// `value` as a job file writes it: JSON's spelling, with a space after each array comma.
std::string toml_text(const nlohmann::json& value) {
  if (!value.is_array()) return value.dump();
  std::string text;
  for (const nlohmann::json& element : value)
    text += (text.empty() ? "" : ", ") + toml_text(element);
  return "[" + text + "]";
}

key_description describe(const detail::field& f) {
  key_description key;
  key.name = f.name;
  if (!f.required) key.default_value = toml_text(f.write());
  key.default_meaning = f.default_meaning;
  key.description = f.description;
  key.values = f.choices;
  key.required = f.required;
  key.expert = f.expert;
  return key;
}

}  // namespace

std::vector<section_description> job_file_keys() {
  job_config defaults;
  std::vector<section_description> sections;
  for (const detail::section& s : detail::job_schema(defaults)) {
    section_description& described = sections.emplace_back();
    described.name = s.name;
    for (const detail::field& f : s.fields) described.keys.push_back(describe(f));
  }
  return sections;
}

std::vector<layer_type_description> layer_type_keys() {
  std::vector<layer_type_description> types;
  for (const std::string& type : layers::layer_type_names()) {
    layers::layer_spec spec = detail::layer_with_defaults(type);
    layer_type_description& described = types.emplace_back();
    described.type = type;
    described.description = detail::layer_type_description(type);
    for (const detail::field& f : detail::layer_fields(spec)) described.keys.push_back(describe(f));
  }
  return types;
}

std::vector<key_description> graph_node_keys() {
  graph_node_spec defaults;
  std::vector<key_description> keys;
  for (const detail::field& f : detail::node_fields(defaults)) keys.push_back(describe(f));
  return keys;
}

}  // namespace troupe::actors
