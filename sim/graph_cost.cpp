#include "sim/graph_cost.h"

#include <algorithm>

#include "actors/engine/memory_estimate.h"
#include "layers/check.h"

namespace troupe::sim {
namespace {

bool recurrent(const actors::graph_node_spec& spec) {
  return spec.route != actors::node_route::chain;
}

const std::vector<double>& measured_pass(const node_profile& node, node_pass pass) {
  switch (pass) {
    case node_pass::forward:
      return node.forward_s;
    case node_pass::evaluate:
      return node.evaluate_s;
    case node_pass::backward:
      return node.backward_s;
    default:
      return node.backward_first_s;
  }
}

}  // namespace

double interpolated_s(const std::vector<int64_t>& rows, const std::vector<double>& seconds,
                      int64_t at) {
  TROUPE_CHECK(!rows.empty() && rows.size() == seconds.size());
  const double x = static_cast<double>(at);
  if (rows.size() == 1) return seconds[0] * x / static_cast<double>(rows[0]);
  // The segment that holds `at`, or the nearest one.
  size_t upper = std::upper_bound(rows.begin(), rows.end(), at) - rows.begin();
  upper = std::clamp<size_t>(upper, 1, rows.size() - 1);
  const double x0 = static_cast<double>(rows[upper - 1]), x1 = static_cast<double>(rows[upper]);
  const double slope = (seconds[upper] - seconds[upper - 1]) / (x1 - x0);
  return std::max(0.0, seconds[upper - 1] + slope * (x - x0));
}

std::optional<graph_stage_cost> graph_stage_cost::make(const actors::job_config& config,
                                                       const actors::ordered_graph& graph,
                                                       actors::stage_range range,
                                                       const device_model& device,
                                                       std::string* error) {
  TROUPE_CHECK(range.first < range.last && range.last <= graph.nodes.size());
  graph_stage_cost cost;
  cost.device_ = device;
  cost.last_ = range.last == graph.nodes.size();
  actors::row_unit unit = actors::row_unit::part;
  for (size_t n = 0; n < range.last; ++n) {
    const actors::graph_node_spec& spec = graph.nodes[n];
    if (n >= range.first) {
      node built;
      built.spec = spec;
      built.widths = graph.widths[n];
      built.input_unit = unit;
      built.arity = spec.route == actors::node_route::tree ? graph.arity : 1;
      auto work = node_work(spec, graph.widths[n].blocks_input, config, error);
      if (!work) return std::nullopt;
      built.work = std::move(*work);
      built.roofline.emplace(built.work, kernel_work{}, device);
      cost.nodes_.push_back(std::move(built));
    }
    if (recurrent(spec) && spec.emit == actors::node_emit::root) unit = actors::row_unit::instance;
  }
  if (cost.last_)
    cost.loss_.emplace(std::vector<block_work>{}, loss_work(cost.output_width()), device);
  return cost;
}

void graph_stage_cost::use_measured(std::vector<node_profile> nodes, double loss_s,
                                    int64_t loss_rows) {
  TROUPE_CHECK(nodes.size() == nodes_.size());
  for (size_t n = 0; n < nodes.size(); ++n) nodes_[n].measured = std::move(nodes[n]);
  measured_loss_s_ = loss_s;
  measured_loss_rows_ = std::max<int64_t>(1, loss_rows);
}

std::vector<int64_t> graph_stage_cost::visit_rows(
    size_t index, const std::vector<layers::instance>& instances) const {
  const node& n = nodes_[index];
  if (!recurrent(n.spec)) return {actors::rows_of(actors::layout_of(instances), n.input_unit)};
  const actors::recurrence_plan plan = actors::plan_recurrence(instances, n.arity, n.spec.emit);
  std::vector<int64_t> rows;
  rows.reserve(plan.visits.size());
  for (const actors::visit_plan& visit : plan.visits)
    rows.push_back(static_cast<int64_t>(visit.parts.size()));
  return rows;
}

double graph_stage_cost::gathers_s(const node& n, int64_t rows) const {
  // The part's own input and its children's states gathered into the visit's rows, its output
  // scattered back (and the same moves of their gradients): a kernel each, over those bytes.
  const double bytes = 2.0 * actors::value_bytes * static_cast<double>(rows) *
                       static_cast<double>(n.widths.blocks_input + n.widths.output);
  const double bandwidth = device_.memory_bandwidth * std::max(1e-9, device_.efficiency);
  return bytes / bandwidth + (2 + n.arity) * device_.launch_overhead_s;
}

double graph_stage_cost::visit_s(const node& n, node_pass pass, int64_t rows) const {
  if (n.measured) {
    const node_profile& measured = *n.measured;
    const bool evaluation = pass == node_pass::evaluate && !measured.evaluation_rows.empty();
    return interpolated_s(evaluation ? measured.evaluation_rows : measured.rows,
                          measured_pass(measured, pass), rows);
  }
  const stage_cost& blocks = *n.roofline;
  double seconds = 0;
  switch (pass) {
    case node_pass::forward:
    case node_pass::evaluate:
      seconds = blocks.forward_s(rows, pass == node_pass::forward);
      break;
    default:
      seconds = blocks.backward_s(rows, pass == node_pass::backward);
  }
  return seconds + (recurrent(n.spec) ? gathers_s(n, rows) : 0.0);
}

double graph_stage_cost::key_s(const std::vector<layers::instance>& instances, node_pass pass,
                               bool need_input_gradient) const {
  double total = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    node_pass charged = pass;
    // As graph_program::backward: only the stage's first node may skip its input gradient, and a
    // loop or tree node always computes it (its children's states need it).
    if (pass == node_pass::backward && i == 0 && !need_input_gradient && !recurrent(nodes_[i].spec))
      charged = node_pass::backward_first;
    for (int64_t rows : visit_rows(i, instances)) total += visit_s(nodes_[i], charged, rows);
  }
  return total;
}

double graph_stage_cost::forward_s(const std::vector<layers::instance>& instances,
                                   bool training) const {
  return key_s(instances, training ? node_pass::forward : node_pass::evaluate, true);
}

double graph_stage_cost::backward_s(const std::vector<layers::instance>& instances,
                                    bool need_input_gradient) const {
  return key_s(instances, node_pass::backward, need_input_gradient);
}

double graph_stage_cost::loss_s(int64_t rows) const {
  if (!last_) return 0;
  if (measured_loss_s_ >= 0) {
    return measured_loss_s_ * static_cast<double>(rows) / static_cast<double>(measured_loss_rows_);
  }
  return loss_->loss_s(rows);
}

double graph_stage_cost::step_s() const {
  double total = 0;
  for (const node& n : nodes_) total += n.measured ? n.measured->step_s : n.roofline->step_s();
  return total;
}

double graph_stage_cost::stash_s() const {
  double total = 0;
  for (const node& n : nodes_) total += n.measured ? n.measured->stash_s : n.roofline->stash_s();
  return total;
}

double graph_stage_cost::predict_s() const {
  double total = 0;
  for (const node& n : nodes_) total += n.measured ? n.measured->predict_s : 0.0;
  return total > 0 ? total : 2 * stash_s();
}

int64_t graph_stage_cost::input_rows(const actors::key_layout& layout) const {
  return actors::rows_of(layout, nodes_.front().input_unit);
}

int64_t graph_stage_cost::output_rows(const actors::key_layout& layout) const {
  const node& last = nodes_.back();
  const bool roots = recurrent(last.spec) && last.spec.emit == actors::node_emit::root;
  return actors::rows_of(layout, roots ? actors::row_unit::instance : last.input_unit);
}

std::vector<block_work> graph_stage_cost::blocks() const {
  std::vector<block_work> all;
  for (const node& n : nodes_) all.insert(all.end(), n.work.begin(), n.work.end());
  return all;
}

}  // namespace troupe::sim
