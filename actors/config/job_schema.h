#pragma once

// The job schema: every section and key of a job file, bound to the job_config member it reads
// and writes, with its description. The one place that defines a key: reading, unknown-key
// suggestions, to_json(), `troupe keys` and docs/guide/job-file.md all walk it; a key's default
// is what its field writes from a default-constructed job_config. Internal to actors/config.

#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/config/toml_fields.h"

namespace troupe::actors::detail {

/// Every section and key, bound to `config`, in the order messages and checks use.
std::vector<section> job_schema(job_config& config);

/// A block of `type` with that type's defaults (a maxpool2d's 2 × 2 window, ...).
layers::layer_spec layer_with_defaults(const std::string& type);

/// The keys a block of `spec.type` takes besides `type`, bound to `spec`.
std::vector<field> layer_fields(layers::layer_spec& spec);

/// One line on what a block of a built-in `type` computes ("" for other types).
std::string layer_type_description(const std::string& type);

/// Reads one block of a layers array (an inline table with a `type`), named `where`
/// ("model.layers[2]") in messages.
problem read_layer(const toml::node& node, const std::string& where, layers::layer_spec* spec);

/// Blocks as config.json writes them: each a table with its type and every key of the type.
nlohmann::json layers_json(const std::vector<layers::layer_spec>& specs);

/// A key whose value is one of the names choice_names<E>() gives: read once into the enum,
/// written back as the name (so config.json and its hashes spell it as the job file does).
template <typename E>
field choice_field(std::string name, E* target) {
  std::vector<std::string> names;
  for (const named_choice<E>& choice : choice_names<E>()) names.push_back(choice.name);
  auto read = [target, names](const toml::node& node, const std::string& label) -> problem {
    std::string text;
    if (problem error = read_string(node, label, names, &text)) return error;
    for (const named_choice<E>& choice : choice_names<E>()) {
      if (text == choice.name) *target = choice.value;
    }
    return std::nullopt;
  };
  auto write = [target] {
    for (const named_choice<E>& choice : choice_names<E>()) {
      if (choice.value == *target) return nlohmann::json(choice.name);
    }
    return nlohmann::json();
  };
  field f{std::move(name), read, write};
  f.choices = std::move(names);
  return f;
}

}  // namespace troupe::actors::detail
