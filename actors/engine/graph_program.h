#pragma once

// A run of a model graph's nodes on one backend (a stage's share of the graph, or the whole of
// it): the forward pass of a key follows the routes of graph_routes.h over the key's
// instances, and leaves a tape, per node, of what each visit's backward pass needs. The
// backward pass retraces the tape in reverse, so a loop's shared weights get one gradient per
// visit, summed, and a tree node's gradient goes back to each of its children. A chain node
// on parts runs its blocks on every part of the key at once, with the instances' bounds in
// layers::run_options::segments, so blocks over token sequences (a transformer's attention,
// learned positions) keep to each instance.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/model_graph.h"
#include "actors/config/model_graph_checks.h"
#include "actors/engine/graph_routes.h"
#include "layers/instance.h"
#include "layers/model.h"

namespace troupe::actors {

/// What one key's forward pass kept for its backward pass.
struct graph_tape {
  struct node_record {
    layers::sequential_context chain;                ///< a chain node's
    std::vector<layers::sequential_context> visits;  ///< a loop or tree node's, one per visit
    recurrence_plan plan;
    int64_t parts = 0;
  };
  std::vector<node_record> nodes;
  std::shared_ptr<const std::vector<layers::instance>> instances;
};

/// A job's graph as its rows visit it: the nodes from the first along `next` to the last (the
/// order a partition cuts and node indices count in), each with its widths, and the arity of
/// the job's data.
struct ordered_graph {
  std::vector<graph_node_spec> nodes;
  std::vector<graph_node_widths> widths;
  int arity = 1;
};

/// The ordered graph of `config`; nothing, with `error` set as check_model_graph() sets it, for
/// a graph that does not pass the checks.
std::optional<ordered_graph> ordered_graph_of(const job_config& config, std::string* error);

class graph_program {
 public:
  /// Builds nodes [first, last) of `nodes`, listed in the order rows visit them, whose widths
  /// `widths` gives (model_graph_widths(), one per node of the whole graph), on `device`; trees
  /// have `arity` children per part. Node n's blocks draw their weights from derive_seed(seed, n),
  /// so any partition holds the weights the whole graph does.
  graph_program(layers::backend& device, layers::stream s,
                const std::vector<graph_node_spec>& nodes,
                const std::vector<graph_node_widths>& widths, size_t first, size_t last, int arity,
                uint64_t seed);

  /// Runs the nodes on a key: `input` holds the rows the first node takes for `instances`.
  /// With a tape (training) it records what backward() needs.
  layers::tensor forward(const layers::run_options& options, const layers::tensor& input,
                         std::shared_ptr<const std::vector<layers::instance>> instances,
                         graph_tape* tape);
  /// Adds the key's weight gradients and returns the gradient of the first node's input rows
  /// (empty when !need_input_gradient).
  layers::tensor backward(const layers::run_options& options, graph_tape& tape,
                          const layers::tensor& output_gradient, bool need_input_gradient);

  /// The rows the first node takes, and the last gives, for a key of these instances.
  int64_t input_rows(const key_layout& layout) const { return rows_of(layout, input_unit_); }
  int64_t output_rows(const key_layout& layout) const { return rows_of(layout, output_unit_); }
  int64_t input_width() const { return widths_[first_].input; }
  int64_t output_width() const { return widths_[last_ - 1].output; }
  row_unit output_unit() const { return output_unit_; }
  /// The rows the graph's last node gives the loss for a key (one label each).
  int64_t loss_rows(const key_layout& layout) const { return rows_of(layout, loss_unit_); }

  std::vector<layers::parameter*> parameters();
  /// "cell.lstm_cell0.weight": each parameter's name, parallel to parameters().
  std::vector<std::string> parameter_names();

 private:
  struct node {
    graph_node_spec spec;  ///< a copy: the program outlives the job's lists
    std::unique_ptr<layers::sequential> blocks;
    int64_t own_input = 0;  ///< loop and tree nodes: the width of the part's own input
    /// Whether its rows are one per part; a chain node's blocks then get the key's instances
    /// as packed sequences (layers::run_options::segments).
    bool per_part = true;
  };
  using segment_list = std::shared_ptr<const std::vector<int64_t>>;

  /// `options` for node `n`'s blocks: with the instances' `segments` where it is a chain node
  /// on parts.
  static layers::run_options node_options(const layers::run_options& options, const node& n,
                                          const segment_list& segments);

  layers::tensor run_chain(const layers::run_options& options, node& n, const layers::tensor& rows,
                           graph_tape::node_record* record);
  layers::tensor run_recurrence(const layers::run_options& options, node& n,
                                const layers::tensor& rows,
                                const std::vector<layers::instance>& instances,
                                graph_tape::node_record* record);
  layers::tensor chain_backward(const layers::run_options& options, node& n,
                                graph_tape::node_record& record, const layers::tensor& gradient,
                                bool need_input_gradient);
  layers::tensor recurrence_backward(const layers::run_options& options, node& n,
                                     graph_tape::node_record& record,
                                     const layers::tensor& gradient);

  layers::backend& device_;
  layers::stream stream_;
  std::vector<graph_node_widths> widths_;
  size_t first_;
  size_t last_;
  int arity_;
  row_unit input_unit_ = row_unit::part;
  row_unit output_unit_ = row_unit::part;
  row_unit loss_unit_ = row_unit::part;
  std::vector<node> nodes_;
};

}  // namespace troupe::actors
