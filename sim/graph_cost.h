#pragma once

// What a stage of a model graph's nodes (model.nodes) costs for one key in virtual time: the sum
// over the visits that the key's own route makes (actors/engine/graph_routes.h), each charged
// its node's cost at the visit's rows. A chain node is visited once, over all of the key's rows
// (its parts, or its instances after a node that emits roots); a loop or tree node once per
// group of ready parts (plan_recurrence: position t of every sequence still that long, a tree's
// nodes level by level), so a key of long sequences or deep trees makes more visits than one of
// short ones. A visit of r rows costs what calibration measured for the node at r rows (a
// profile's node table, interpolated: sim/profile.h), or else the roofline model of the node's
// blocks at r rows plus, for a loop or tree node, the rows gathered into the visit and scattered
// back.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine/graph_program.h"
#include "actors/engine/partition.h"
#include "sim/cost_model.h"
#include "sim/profile.h"

namespace troupe::sim {

/// The passes of a node's visit that are charged.
enum class node_pass { forward, evaluate, backward, backward_first };

/// One visit's cost at `rows` from a measured node table: linear between the measured row
/// counts, and along the nearest segment's line beyond them (never below 0); proportional to
/// the rows with a single measurement.
double interpolated_s(const std::vector<int64_t>& rows, const std::vector<double>& seconds,
                      int64_t at);

/// The nodes of one stage of a model graph and what each of their visits costs.
class graph_stage_cost {
 public:
  /// Nodes `range` of `graph` (ordered_graph_of(config)) on `device`; the stage that holds the
  /// graph's last node also charges the loss. Nothing, with `error` set, when a node's blocks do
  /// not chain.
  static std::optional<graph_stage_cost> make(const actors::job_config& config,
                                              const actors::ordered_graph& graph,
                                              actors::stage_range range, const device_model& device,
                                              std::string* error);

  /// Charges the profile's times instead of the roofline model: `nodes` are the profile's
  /// entries for this stage's nodes (one each, in order); the loss took `loss_s` for
  /// `loss_rows` rows.
  void use_measured(std::vector<node_profile> nodes, double loss_s, int64_t loss_rows);

  /// A key's forward pass over its instances (in training, or in evaluation).
  double forward_s(const std::vector<layers::instance>& instances, bool training) const;
  /// A key's backward pass; without `need_input_gradient` the stage's first node (the graph's
  /// first) computes no input gradient.
  double backward_s(const std::vector<layers::instance>& instances, bool need_input_gradient) const;
  /// The loss over `rows` rows of the last node's output.
  double loss_s(int64_t rows) const;
  double step_s() const;
  double stash_s() const;
  /// A predicted copy of the weights: measured, or two stashes.
  double predict_s() const;

  /// The row count of each visit that the stage's node `node` (counted from the stage's first)
  /// makes for a key of `instances`, in route order.
  std::vector<int64_t> visit_rows(size_t node,
                                  const std::vector<layers::instance>& instances) const;
  size_t nodes() const { return nodes_.size(); }

  /// The rows the stage takes, and gives, for a key, and their widths.
  int64_t input_rows(const actors::key_layout& layout) const;
  int64_t output_rows(const actors::key_layout& layout) const;
  int64_t input_width() const { return nodes_.front().widths.input; }
  int64_t output_width() const { return nodes_.back().widths.output; }

  /// Every block's work of the stage's nodes, in order (the stage's memory and parameters).
  std::vector<block_work> blocks() const;

 private:
  struct node {
    actors::graph_node_spec spec;
    actors::graph_node_widths widths;
    actors::row_unit input_unit = actors::row_unit::part;
    int arity = 1;
    std::vector<block_work> work;
    std::optional<stage_cost> roofline;
    std::optional<node_profile> measured;
  };

  graph_stage_cost() = default;
  /// One visit of `n` over `rows` rows.
  double visit_s(const node& n, node_pass pass, int64_t rows) const;
  /// A whole key's `pass` over the stage's nodes.
  double key_s(const std::vector<layers::instance>& instances, node_pass pass,
               bool need_input_gradient) const;
  /// What gathering a loop or tree node's visit of `rows` rows and scattering it back moves.
  double gathers_s(const node& n, int64_t rows) const;

  std::vector<node> nodes_;
  device_model device_;
  bool last_ = false;
  std::optional<stage_cost> loss_;  ///< the roofline loss (the last stage)
  double measured_loss_s_ = -1;     ///< < 0: the roofline loss
  int64_t measured_loss_rows_ = 1;
};

}  // namespace troupe::sim
