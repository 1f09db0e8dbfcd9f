#pragma once

// The keys of `[[model.nodes]]`, a model that is a graph of nodes (model_graph.h): each node's
// name, blocks, route, emit and next, read and written like the job schema's other keys, and
// `--set model.nodes.NAME.KEY=value` overrides of one node's key. Internal to actors/config.

#include <set>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/config/toml_fields.h"

namespace troupe::actors::detail {

/// model.nodes: an array of node tables, bound to `model.nodes`; written to config.json only
/// when the job has nodes.
field nodes_field(model_config& model);

/// The keys one node takes, bound to `node`.
std::vector<field> node_fields(graph_node_spec& node);

/// Whether `text` overrides one node's key ("model.nodes.cell.route=loop"), which
/// apply_node_override() applies instead of apply_override().
bool is_node_override(const std::string& text);

/// Applies "model.nodes.NAME.KEY=value" to the node of `root` named NAME (VALUE read as
/// apply_override() reads it) and adds the key to `overridden`; a message when the override is
/// malformed or no node has that name.
problem apply_node_override(const std::string& text, toml::table* root,
                            std::set<std::string>* overridden);

}  // namespace troupe::actors::detail
