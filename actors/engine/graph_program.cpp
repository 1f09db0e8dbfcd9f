#include "actors/engine/graph_program.h"

#include "layers/check.h"
#include "layers/random.h"
#include "layers/row_moves.h"

namespace troupe::actors {
namespace {

bool recurrent(const graph_node_spec& spec) { return spec.route != node_route::chain; }

/// Child k of every part of `visit` (arity slots per part).
std::vector<int64_t> children_at(const visit_plan& visit, int arity, int k) {
  std::vector<int64_t> rows(visit.parts.size());
  for (size_t r = 0; r < rows.size(); ++r)
    rows[r] = visit.children[r * static_cast<size_t>(arity) + static_cast<size_t>(k)];
  return rows;
}

/// `rows` seen as [rows, blocks' per-row shape] (what the blocks take), or back as [rows, width].
layers::tensor as_batch(const layers::tensor& rows, const layers::shape& sample) {
  layers::shape dims{rows.rows()};
  dims.insert(dims.end(), sample.begin(), sample.end());
  return rows.reshaped(dims);
}

layers::tensor as_rows(const layers::tensor& batch, int64_t width) {
  return batch.reshaped({batch.rows(), width});
}

/// Each instance's part rows, [first_part[i], first_part[i + 1]), as packed sequences.
std::shared_ptr<const std::vector<int64_t>> segments_of(
    const std::vector<layers::instance>& instances) {
  return std::make_shared<const std::vector<int64_t>>(layout_of(instances).first_part);
}

}  // namespace

std::optional<ordered_graph> ordered_graph_of(const job_config& config, std::string* error) {
  ordered_graph graph;
  graph.arity = expected_arity(config.data);
  auto widths = model_graph_widths(config, graph.arity, error);
  if (!widths) return std::nullopt;
  for (size_t n : model_graph_order(config)) {
    graph.nodes.push_back(config.model.nodes[n]);
    graph.widths.push_back((*widths)[n]);
  }
  return graph;
}

graph_program::graph_program(layers::backend& device, layers::stream s,
                             const std::vector<graph_node_spec>& nodes,
                             const std::vector<graph_node_widths>& widths, size_t first,
                             size_t last, int arity, uint64_t seed)
    : device_(device), stream_(s), widths_(widths), first_(first), last_(last), arity_(arity) {
  TROUPE_CHECK(first < last && last <= nodes.size() && widths.size() == nodes.size());
  row_unit unit = row_unit::part;
  for (const graph_node_spec& spec : nodes) {
    if (recurrent(spec) && spec.emit == node_emit::root) loss_unit_ = row_unit::instance;
  }
  for (size_t n = 0; n < last; ++n) {
    if (n == first) input_unit_ = unit;
    const graph_node_spec& spec = nodes[n];
    if (recurrent(spec) && spec.emit == node_emit::root) unit = row_unit::instance;
    if (n < first) continue;
    const int node_arity = spec.route == node_route::tree ? arity : 1;
    node built{spec, nullptr, 0, unit == row_unit::part};
    const int64_t blocks_input = widths[n].blocks_input;
    if (recurrent(spec)) built.own_input = widths[n].input;
    TROUPE_CHECK(blocks_input ==
                 widths[n].input + (recurrent(spec) ? node_arity : 0) * widths[n].output);
    built.blocks =
        std::make_unique<layers::sequential>(device, s, spec.layers, widths[n].blocks_shape(), 0,
                                             spec.layers.size(), layers::derive_seed(seed, n));
    TROUPE_CHECK(layers::element_count(built.blocks->output_shape()) == widths[n].output);
    nodes_.push_back(std::move(built));
  }
  output_unit_ = unit;
}

layers::tensor graph_program::forward(
    const layers::run_options& options, const layers::tensor& input,
    std::shared_ptr<const std::vector<layers::instance>> instances, graph_tape* tape) {
  TROUPE_CHECK(instances != nullptr);
  if (tape) {
    tape->nodes.clear();
    tape->nodes.resize(nodes_.size());
    tape->instances = instances;
  }
  layers::tensor rows = as_rows(input, input_width());
  const segment_list segments = segments_of(*instances);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    graph_tape::node_record* record = tape ? &tape->nodes[i] : nullptr;
    node& n = nodes_[i];
    rows = recurrent(n.spec) ? run_recurrence(options, n, rows, *instances, record)
                             : run_chain(node_options(options, n, segments), n, rows, record);
  }
  return rows;
}

layers::run_options graph_program::node_options(const layers::run_options& options, const node& n,
                                                const segment_list& segments) {
  layers::run_options result = options;
  if (!recurrent(n.spec) && n.per_part) result.segments = segments;
  return result;
}

layers::tensor graph_program::run_chain(const layers::run_options& options, node& n,
                                        const layers::tensor& rows,
                                        graph_tape::node_record* record) {
  layers::tensor output = n.blocks->forward(options, as_batch(rows, n.blocks->input_shape()),
                                            record ? &record->chain : nullptr);
  return as_rows(output, layers::element_count(n.blocks->output_shape()));
}

layers::tensor graph_program::run_recurrence(const layers::run_options& options, node& n,
                                             const layers::tensor& rows,
                                             const std::vector<layers::instance>& instances,
                                             graph_tape::node_record* record) {
  const int arity = n.spec.route == node_route::tree ? arity_ : 1;
  recurrence_plan plan = plan_recurrence(instances, arity, n.spec.emit);
  const int64_t parts = layout_of(instances).parts();
  TROUPE_CHECK(rows.rows() == parts && rows.row_size() == n.own_input);
  const int64_t width = layers::element_count(n.blocks->output_shape());
  const int64_t in_width = layers::element_count(n.blocks->input_shape());
  // Every part's output, written visit by visit and read by its parent's visit (the join).
  layers::tensor states(device_, {parts, width});
  for (const visit_plan& visit : plan.visits) {
    const int64_t count = static_cast<int64_t>(visit.parts.size());
    layers::tensor joined(device_, {count, in_width});
    layers::gather_rows(stream_, rows, 0, visit.parts, joined, 0, n.own_input);
    for (int k = 0; k < arity; ++k) {
      layers::gather_rows(stream_, states, 0, children_at(visit, arity, k), joined,
                          n.own_input + k * width, width);
    }
    layers::sequential_context* context = nullptr;
    if (record) context = &record->visits.emplace_back();
    layers::tensor output =
        n.blocks->forward(options, as_batch(joined, n.blocks->input_shape()), context);
    layers::scatter_rows(stream_, as_rows(output, width), 0, visit.parts, states, 0, width, false);
  }
  layers::tensor emitted(device_, {static_cast<int64_t>(plan.emitted.size()), width});
  layers::gather_rows(stream_, states, 0, plan.emitted, emitted, 0, width);
  if (record) {
    record->plan = std::move(plan);
    record->parts = parts;
  }
  return emitted;
}

layers::tensor graph_program::backward(const layers::run_options& options, graph_tape& tape,
                                       const layers::tensor& output_gradient,
                                       bool need_input_gradient) {
  TROUPE_CHECK(tape.nodes.size() == nodes_.size());
  layers::tensor gradient = as_rows(output_gradient, output_width());
  TROUPE_CHECK(tape.instances != nullptr);
  const segment_list segments = segments_of(*tape.instances);
  for (size_t i = nodes_.size(); i-- > 0;) {
    node& n = nodes_[i];
    const bool need = i > 0 || need_input_gradient;
    if (recurrent(n.spec)) {
      gradient = recurrence_backward(options, n, tape.nodes[i], gradient);
    } else {
      gradient =
          chain_backward(node_options(options, n, segments), n, tape.nodes[i], gradient, need);
    }
    if (gradient.empty()) break;
  }
  tape.nodes.clear();
  return need_input_gradient ? gradient : layers::tensor();
}

layers::tensor graph_program::chain_backward(const layers::run_options& options, node& n,
                                             graph_tape::node_record& record,
                                             const layers::tensor& gradient,
                                             bool need_input_gradient) {
  layers::tensor input_gradient = n.blocks->backward(
      options, record.chain, as_batch(gradient, n.blocks->output_shape()), need_input_gradient);
  if (input_gradient.empty()) return input_gradient;
  return as_rows(input_gradient, layers::element_count(n.blocks->input_shape()));
}

layers::tensor graph_program::recurrence_backward(const layers::run_options& options, node& n,
                                                  graph_tape::node_record& record,
                                                  const layers::tensor& gradient) {
  const recurrence_plan& plan = record.plan;
  const int arity = plan.arity;
  const int64_t width = layers::element_count(n.blocks->output_shape());
  const int64_t in_width = layers::element_count(n.blocks->input_shape());
  // The gradient of every part's output: what left the node, then what each parent's visit
  // sends back to its children (parents are visited after their children, so retracing the
  // visits in reverse finds each part's gradient complete).
  layers::tensor states = layers::tensor::filled(device_, stream_, {record.parts, width}, 0.0f);
  layers::scatter_rows(stream_, gradient, 0, plan.emitted, states, 0, width, true);
  layers::tensor input_gradient(device_, {record.parts, n.own_input});
  for (size_t v = plan.visits.size(); v-- > 0;) {
    const visit_plan& visit = plan.visits[v];
    const int64_t count = static_cast<int64_t>(visit.parts.size());
    layers::tensor output_gradient(device_, {count, width});
    layers::gather_rows(stream_, states, 0, visit.parts, output_gradient, 0, width);
    layers::tensor joined = n.blocks->backward(
        options, record.visits[v], as_batch(output_gradient, n.blocks->output_shape()), true);
    joined = as_rows(joined, in_width);
    layers::scatter_rows(stream_, joined, 0, visit.parts, input_gradient, 0, n.own_input, false);
    for (int k = 0; k < arity; ++k) {
      layers::scatter_rows(stream_, joined, n.own_input + k * width, children_at(visit, arity, k),
                           states, 0, width, true);
    }
  }
  record.visits.clear();
  return input_gradient;
}

std::vector<layers::parameter*> graph_program::parameters() {
  std::vector<layers::parameter*> all;
  for (node& n : nodes_) {
    for (layers::parameter* p : n.blocks->parameters()) all.push_back(p);
  }
  return all;
}

std::vector<std::string> graph_program::parameter_names() {
  std::vector<std::string> names;
  for (node& n : nodes_) {
    for (size_t i = 0; i < n.blocks->size(); ++i) {
      const std::string prefix =
          n.spec.name + "." + layers::uncut_type(n.spec.layers[i].type) + std::to_string(i) + ".";
      for (layers::parameter* p : n.blocks->at(i).parameters()) names.push_back(prefix + p->name);
    }
  }
  return names;
}

}  // namespace troupe::actors
