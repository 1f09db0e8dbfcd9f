#include "actors/config/model_graph_checks.h"

#include <map>

#include "actors/config/toml_fields.h"
#include "layers/model.h"

namespace troupe::actors {
namespace {

using problem = std::optional<std::string>;
using node_list = std::vector<graph_node_spec>;
using name_index = std::map<std::string, size_t>;

/// A wide row for finding a recurrent node's output width: wider than any state it carries.
constexpr int64_t kProbeWidth = int64_t{1} << 20;

/// `model.nodes[2] ("cell")`.
std::string label_of(const node_list& nodes, size_t i) {
  return "model.nodes[" + std::to_string(i) + "] (\"" + nodes[i].name + "\")";
}

bool recurrent(const graph_node_spec& node) { return node.route != node_route::chain; }

/// Every name once; fills `index` with each name's node.
problem check_names(const node_list& nodes, name_index* index) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    const auto [found, added] = index->emplace(nodes[i].name, i);
    if (!added) {
      return label_of(nodes, i) + ": " + label_of(nodes, found->second) +
             " has the same name; each node's name must be its own";
    }
  }
  return std::nullopt;
}

problem check_edges(const node_list& nodes, const name_index& index) {
  std::vector<std::string> names;
  for (const auto& entry : index) names.push_back(entry.first);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string& next = nodes[i].next;
    if (next.empty() || index.count(next) > 0) continue;
    return label_of(nodes, i) + ": next = \"" + next + "\" names no node of model.nodes" +
           detail::suggestion(next, names);
  }
  return std::nullopt;
}

/// The rules of one node on its own: routes that need an exit, a sequence or a tree.
problem check_route(const node_list& nodes, size_t i, int arity) {
  const graph_node_spec& node = nodes[i];
  const std::string label = label_of(nodes, i);
  const std::string route = std::string("route = \"") + to_string(node.route) + "\"";
  if (!recurrent(node) && node.emit == node_emit::root) {
    return label + ": emit = \"root\" applies only to a node with route = \"loop\" or \"tree\"";
  }
  if (recurrent(node) && node.next.empty()) {
    return label + ": a loop with no exit: a node with " + route +
           " needs `next`, the node its emitted rows go to";
  }
  if (node.route == node_route::tree && arity < 2) {
    return label + ": " + route + " joins a part's children, but the data's parts have at most " +
           std::to_string(arity) + " child (sequences): use route = \"loop\"";
  }
  if (node.route == node_route::loop && arity > 1) {
    return label + ": " + route + " follows a sequence, but the data are trees (arity " +
           std::to_string(arity) + "): use route = \"tree\"";
  }
  return std::nullopt;
}

/// `next` edges never lead back: a node revisits itself only by its own route.
problem check_cycles(const node_list& nodes, const name_index& index) {
  std::vector<int> state(nodes.size(), 0);  // 0: not seen, 1: on the walk, 2: done
  for (size_t start = 0; start < nodes.size(); ++start) {
    std::vector<size_t> walk;
    size_t i = start;
    while (state[i] == 0) {
      state[i] = 1;
      walk.push_back(i);
      if (nodes[i].next.empty()) break;
      i = index.at(nodes[i].next);
    }
    // The walk stopped at a last node (no cycle), at a node of an earlier walk (none either),
    // or at node i of this walk again: the cycle from i back to i.
    if (state[i] == 1 && !nodes[i].next.empty()) {
      size_t first = 0;
      while (walk[first] != i) ++first;
      std::string cycle;
      for (size_t k = first; k < walk.size(); ++k) cycle += nodes[walk[k]].name + " -> ";
      return label_of(nodes, i) + ": a cycle outside a loop rule: " + cycle + nodes[i].name +
             " (a node revisits itself only by its own route = \"loop\" or \"tree\")";
    }
    for (size_t k : walk) state[k] = 2;
  }
  return std::nullopt;
}

/// One node without `next`: the last, whose rows go to the loss.
problem check_last(const node_list& nodes) {
  std::vector<size_t> last;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].next.empty()) last.push_back(i);
  }
  if (last.empty()) {
    return std::string(
        "model.nodes: every node has `next`, but the last node, whose rows go to "
        "the loss, has none");
  }
  if (last.size() == 1) return std::nullopt;
  return label_of(nodes, last[0]) + " and " + label_of(nodes, last[1]) +
         " both have no `next`: a graph has one last node, whose rows go to the loss";
}

std::vector<size_t> path_from_first(const node_list& nodes, const name_index& index) {
  std::vector<size_t> path{0};
  while (!nodes[path.back()].next.empty()) path.push_back(index.at(nodes[path.back()].next));
  return path;
}

problem check_reached(const node_list& nodes, const std::vector<size_t>& path) {
  std::vector<bool> reached(nodes.size(), false);
  for (size_t i : path) reached[i] = true;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (reached[i]) continue;
    return label_of(nodes, i) + ": no path from the first node, " + label_of(nodes, 0) +
           ", reaches it (the rows go from the first node along `next` only)";
  }
  return std::nullopt;
}

/// Every check but the shapes; fills `path` with the order the rows visit the nodes.
problem check_structure(const node_list& nodes, int arity, std::vector<size_t>* path) {
  if (nodes.empty()) return std::string("model.nodes: a graph needs one node at least");
  name_index index;
  if (problem error = check_names(nodes, &index)) return error;
  if (problem error = check_edges(nodes, index)) return error;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (problem error = check_route(nodes, i, arity)) return error;
  }
  if (problem error = check_cycles(nodes, index)) return error;
  if (problem error = check_last(nodes)) return error;
  *path = path_from_first(nodes, index);
  return check_reached(nodes, *path);
}

// Shapes -----------------------------------------------------------------------------------------

/// The features per row `node`'s blocks output on rows of shape `row`; nothing, with `*why`
/// naming the first block that does not take its input under `label`, when they do not chain.
std::optional<int64_t> output_width(const graph_node_spec& node, const std::string& label,
                                    const layers::shape& row, std::string* why) {
  std::string message;
  auto shapes = layers::infer_shapes(node.layers, row, &message);
  if (shapes) return layers::element_count(shapes->back());
  const std::string prefix = "model.";
  *why = message.rfind(prefix, 0) == 0 ? label + "." + message.substr(prefix.size())
                                       : label + ": " + message;
  return std::nullopt;
}

/// What a node is fed: "the 8 features model.nodes[0] ("embed") outputs per row".
std::string source_text(int64_t received, const std::string& before) {
  if (before.empty()) return "a part's token id (1 feature)";
  return "the " + std::to_string(received) + " features " + before + " outputs per row";
}

/// How a loop or tree node's rows are made, for a node whose own output is `output` wide.
std::string recurrent_row_text(const graph_node_spec& node, int arity, int64_t received,
                               const std::string& before, int64_t output) {
  const int64_t children = node.route == node_route::loop ? 1 : arity;
  const std::string own = std::to_string(output);
  const std::string after = node.route == node_route::loop
                                ? "its own output of " + own + " for the part before"
                                : "its own outputs of " + own + " for each of the part's " +
                                      std::to_string(arity) + " children (the data's arity)";
  return "a " + std::string(to_string(node.route)) + " node's rows are " +
         source_text(received, before) + ", followed by " + after + ": " +
         std::to_string(received + children * output) + " in all";
}

/// A loop or tree node's widths: the output width o for which its blocks on rows of
/// received + children × o output o.
problem recurrent_widths(const graph_node_spec& node, const std::string& label, int arity,
                         const std::string& before, graph_node_widths* widths) {
  const int64_t children = node.route == node_route::loop ? 1 : arity;
  const int64_t received = widths->input;
  std::string first_failure, failure, why;
  const std::optional<int64_t> guesses[] = {
      output_width(node, label, {received}, &first_failure),
      output_width(node, label, {received + children * kProbeWidth}, &why)};
  for (const std::optional<int64_t>& guess : guesses) {
    if (!guess) continue;
    const int64_t input = received + children * *guess;
    const std::string rows = recurrent_row_text(node, arity, received, before, *guess);
    const std::optional<int64_t> output = output_width(node, label, {input}, &why);
    if (output == guess) {
      widths->blocks_input = input;
      widths->output = *output;
      return std::nullopt;
    }
    if (!output && failure.empty()) failure = why + " (" + rows + ")";
    if (output && failure.empty()) {
      failure = label + ": shapes do not meet: " + rows + ", but on rows of " +
                std::to_string(input) + " its blocks output " + std::to_string(*output) + ", not " +
                std::to_string(*guess) +
                " (begin the node with a block of fixed output width, such as linear)";
    }
  }
  return failure.empty() ? first_failure : failure;
}

/// The widths of the node at `i`, fed rows of `widths->input` by `before` ("" for the first).
problem node_shape(const node_list& nodes, size_t i, int arity, const std::string& before,
                   graph_node_widths* widths) {
  const graph_node_spec& node = nodes[i];
  const std::string label = label_of(nodes, i);
  if (recurrent(node)) return recurrent_widths(node, label, arity, before, widths);
  std::string why;
  widths->blocks_input = widths->input;
  widths->token_rows = !before.empty();
  const std::optional<int64_t> output = output_width(node, label, widths->blocks_shape(), &why);
  if (!output) {
    const std::string token =
        widths->token_rows ? ", each one token, " + layers::to_string(widths->blocks_shape()) : "";
    return why + " (its rows are " + source_text(widths->input, before) + token + ")";
  }
  widths->output = *output;
  return std::nullopt;
}

/// Why the loop or tree node at `i` cannot run after `root_emitter`: its rows are one per
/// instance, not one per part, so a join never gets its children.
std::string after_roots(const node_list& nodes, size_t i, const std::string& root_emitter) {
  const bool tree = nodes[i].route == node_route::tree;
  return label_of(nodes, i) +
         (tree ? ": a join with no way to complete: " : ": a loop with no parts to visit: ") +
         root_emitter +
         " before it emits only roots (emit = \"root\": one row per instance), so its route = "
         "\"" +
         to_string(nodes[i].route) + "\" never gets the parts of an instance";
}

/// The shapes along `path`, and that a loop or tree node gets one row per part.
problem check_shapes(const node_list& nodes, int arity, const std::vector<size_t>& path,
                     std::vector<graph_node_widths>* widths) {
  widths->assign(nodes.size(), graph_node_widths{});
  int64_t received = 1;
  std::string before, root_emitter;
  for (size_t i : path) {
    const graph_node_spec& node = nodes[i];
    if (recurrent(node) && !root_emitter.empty()) return after_roots(nodes, i, root_emitter);
    graph_node_widths& own = (*widths)[i];
    own.input = received;
    if (problem error = node_shape(nodes, i, arity, before, &own)) return error;
    if (recurrent(node) && node.emit == node_emit::root) root_emitter = label_of(nodes, i);
    own.emits_per_part = root_emitter.empty();
    received = own.output;
    before = label_of(nodes, i);
  }
  return std::nullopt;
}

}  // namespace

int expected_arity(const data_config& data) {
  return data.dataset == dataset_kind::listops ? 2 : 1;
}

std::optional<std::vector<graph_node_widths>> model_graph_widths(const job_config& config,
                                                                 int arity, std::string* error) {
  const node_list& nodes = config.model.nodes;
  std::vector<size_t> path;
  std::vector<graph_node_widths> widths;
  problem message = check_structure(nodes, arity, &path);
  if (!message) message = check_shapes(nodes, arity, path, &widths);
  if (!message) return widths;
  if (error != nullptr) *error = *message;
  return std::nullopt;
}

bool check_model_graph(const job_config& config, int arity, std::string* error) {
  return model_graph_widths(config, arity, error).has_value();
}

std::vector<size_t> model_graph_order(const job_config& config) {
  name_index index;
  const node_list& nodes = config.model.nodes;
  for (size_t i = 0; i < nodes.size(); ++i) index.emplace(nodes[i].name, i);
  return nodes.empty() ? std::vector<size_t>{} : path_from_first(nodes, index);
}

}  // namespace troupe::actors
