#include "actors/config/node_schema.h"

#include <algorithm>
#include <cctype>

#include "actors/config/job_schema.h"

namespace troupe::actors::detail {
namespace {

constexpr const char* kNodePrefix = "model.nodes.";

/// Names are letters, digits, '_' and '-', so that `model.nodes.NAME.KEY` names a node's key.
bool is_node_name(const std::string& name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '-';
  });
}

/// "model.nodes[2]", with the node's name when its table gives one: `model.nodes[2] ("cell")`.
std::string node_label(const toml::table& table, const std::string& element) {
  const auto* name = table.get_as<std::string>("name");
  return name == nullptr ? element : element + " (\"" + name->get() + "\")";
}

problem read_node(const toml::node& node, const std::string& element, graph_node_spec* spec) {
  const auto* table = node.as_table();
  if (table == nullptr) {
    return wrong_type(element, "a table ([[model.nodes]] with name, layers, route, emit, next)",
                      node);
  }
  const std::string where = node_label(*table, element);
  const std::vector<field> fields = node_fields(*spec);
  naming names{"", where + ".", {}, nullptr};
  for (const field& f : fields) names.suggestions.push_back(where + "." + f.name);
  if (problem error = read_fields(*table, fields, names)) return error;
  if (!is_node_name(spec->name)) {
    return where + ".name must be letters, digits, '_' and '-', got \"" + spec->name + "\"";
  }
  return std::nullopt;
}

nlohmann::json node_json(graph_node_spec node) {
  nlohmann::json json = nlohmann::json::object();
  for (const field& f : node_fields(node)) json[f.name] = f.write();
  return json;
}

}  // namespace

std::vector<field> node_fields(graph_node_spec& node) {
  auto read_blocks = [&node](const toml::node& value, const std::string& label) {
    return read_array(value, label, "an array of layer tables", read_layer, &node.layers);
  };
  return {
      required(string_field("name", &node.name))
          .about("what other nodes' `next` calls this node (letters, digits, '_' and '-')"),
      required({"layers", read_blocks, [&node] { return layers_json(node.layers); }})
          .about("the node's blocks in order, as in model.layers; they run on every row the node "
                 "visits, one row per part of an instance (or per instance)"),
      choice_field("route", &node.route)
          .about("which rows the node runs on: chain, every row it is sent once; loop, a "
                 "sequence's parts in order, each row followed by the node's output for the part "
                 "before; tree, a tree's parts children first, each row followed by its "
                 "children's outputs (the data's arity of them)"),
      choice_field("emit", &node.emit)
          .about("loop and tree: whose outputs go on to `next`, every part's or only the root's "
                 "(one row per instance)"),
      string_field("next", &node.next)
          .about("the node the emitted rows go to")
          .default_means("none: the last node, whose rows go to the loss")};
}

field nodes_field(model_config& model) {
  auto read = [&model](const toml::node& node, const std::string& label) {
    return read_array(node, label, "an array of node tables ([[model.nodes]])", read_node,
                      &model.nodes);
  };
  auto write = [&model] {
    nlohmann::json json = nlohmann::json::array();
    for (const graph_node_spec& node : model.nodes) json.push_back(node_json(node));
    return json;
  };
  return field{"nodes", read, write}
      .about(
          "a graph of nodes instead of model.layers, each a [[model.nodes]] table (see the "
          "node keys below); the first node takes each part's token, the last one's rows go "
          "to the loss")
      .default_means("none: the model is model.layers")
      .written_only_if([&model] { return !model.nodes.empty(); });
}

bool is_node_override(const std::string& text) {
  return trim(text.substr(0, text.find('='))).rfind(kNodePrefix, 0) == 0;
}

problem apply_node_override(const std::string& text, toml::table* root,
                            std::set<std::string>* overridden) {
  const size_t equals = text.find('=');
  const std::string key = trim(text.substr(0, equals));
  const std::string rest = key.substr(std::string(kNodePrefix).size());
  const size_t dot = rest.find('.');
  if (equals == std::string::npos || dot == std::string::npos || dot == 0 ||
      dot + 1 == rest.size() || rest.find('.', dot + 1) != std::string::npos) {
    return "malformed override '" + text + "': a node's key is set as model.nodes.NAME.KEY=value";
  }
  const std::string name = rest.substr(0, dot);
  toml::array* nodes = nullptr;
  if (toml::table* model = root->get_as<toml::table>("model")) {
    nodes = model->get_as<toml::array>("nodes");
  }
  toml::table* found = nullptr;
  for (size_t i = 0; nodes != nullptr && i < nodes->size(); ++i) {
    toml::table* node = nodes->get_as<toml::table>(i);
    const auto* node_name = node == nullptr ? nullptr : node->get_as<std::string>("name");
    if (node_name != nullptr && node_name->get() == name) found = node;
  }
  if (found == nullptr) {
    return "override of '" + key + "': no node of model.nodes is named \"" + name + "\"";
  }
  toml::table value = parse_override_value(trim(text.substr(equals + 1)));
  found->insert_or_assign(rest.substr(dot + 1), std::move(*value.get("v")));
  overridden->insert(key);
  return std::nullopt;
}

}  // namespace troupe::actors::detail
