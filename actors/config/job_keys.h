#pragma once

// The job file's keys as `troupe keys` and docs/guide/job-file.md describe them: each key's
// default, taken from a default-constructed job_config, and its one-line description, both
// from the job schema (actors/config/job_schema.cpp).

#include <string>
#include <vector>

namespace troupe::actors {

/// One key of a section or of a layer block.
struct key_description {
  std::string name;
  /// The default as a job file writes it ("0", "\"sync\"", "[1, 28, 28]"); "" when required.
  std::string default_value;
  std::string default_meaning;      ///< what a special default stands for ("every core"), or ""
  std::string description;          ///< one line
  std::vector<std::string> values;  ///< the values a closed set accepts (empty: not a closed set)
  bool required = false;
  bool expert = false;  ///< tuning that most jobs leave alone
};

/// A top-level table of the job file and its keys, in the schema's order.
struct section_description {
  std::string name;
  std::vector<key_description> keys;
};

/// A type a block of model.layers may take and its keys besides `type`.
struct layer_type_description {
  std::string type;
  std::string description;  ///< "" for a type registered by a program that embeds troupe
  std::vector<key_description> keys;
};

/// Every section of the job file with its keys.
std::vector<section_description> job_file_keys();

/// Every layer type a block may take: the built-in ones, then any registered ones.
std::vector<layer_type_description> layer_type_keys();

/// The keys of one `[[model.nodes]]` table (a model that is a graph of nodes).
std::vector<key_description> graph_node_keys();

}  // namespace troupe::actors
