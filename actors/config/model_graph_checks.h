#pragma once

// The checks of a graph model (`[[model.nodes]]`, model_graph.h) and the per-row widths its
// nodes run at. A valid graph is one path of `next` edges from the first node to the one last
// node through every node; a node revisits itself only by its own route (loop or tree), never
// through `next`; a loop or tree node has an exit and rows of one per part to visit; and the
// shapes meet: the first node takes one token id per row, each node takes the rows the node
// before it emits, and a loop or tree node's rows also carry its own outputs for the parts
// before (loop: one) or for the part's children (tree: the data's arity of them).
//
// A chain node after the first sees each row as one token, [1, width], so blocks over token
// sequences (layernorm, transformer_block, lm_head) run on its rows; where its rows are one per
// part, such blocks get the key's instances as packed sequences (layers::run_options::segments,
// set by graph_program): a transformer attends within each instance, an embedding with explicit
// positions counts them from 0 in each.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "layers/tensor.h"

namespace troupe::actors {

/// One node's per-row widths in a valid graph. (actors/engine/graph_program.h's node_widths
/// holds `input` and `output` of these.)
struct graph_node_widths {
  /// Features per row the node gets from the node before it (1 for the first: a token id).
  int64_t input = 0;
  /// Features per row its blocks take: `input`, followed for a loop node by its own output for
  /// the part before, and for a tree node by its outputs for the part's `arity` children.
  int64_t blocks_input = 0;
  /// Features per row its blocks give, and it emits.
  int64_t output = 0;
  /// Whether the rows it emits are one per part (false once a node before it, or it, emits
  /// only roots: then one per instance).
  bool emits_per_part = true;
  /// Whether its blocks take each row as one token, [1, blocks_input] (a chain node after the
  /// first), rather than as [blocks_input].
  bool token_rows = false;

  /// The shape its blocks take each row as.
  layers::shape blocks_shape() const {
    return token_rows ? layers::shape{1, blocks_input} : layers::shape{blocks_input};
  }
};

/// The most children a part of the job's data has, as far as the job can tell before the data
/// is loaded: 2 for listops (binary trees), else 1 (sequences). The loaded data's
/// layers::instance_dataset::arity is the one to check against once it is there.
int expected_arity(const data_config& data);

/// Checks the graph of `config.model.nodes` on data whose parts have at most `arity` children;
/// false with `*error` set to one line naming the node, as `model.nodes[2] ("cell")`, and what
/// is wrong: a `next` that names no node, two nodes of one name, a cycle outside a loop rule,
/// a loop with no exit, a join with no way to complete, a tree node on sequences or a loop
/// node on trees, more than one last node, a node the first one's path does not reach, or
/// shapes that do not meet (saying what width was expected and why).
bool check_model_graph(const job_config& config, int arity, std::string* error);

/// Each node's widths, in the order of model.nodes, for a graph that passes
/// check_model_graph(); nothing, with `*error` set to its message, for one that does not.
std::optional<std::vector<graph_node_widths>> model_graph_widths(const job_config& config,
                                                                 int arity, std::string* error);

/// The indices into model.nodes in the order the rows visit them: the first node, then along
/// `next` to the last; for a graph that passes check_model_graph().
std::vector<size_t> model_graph_order(const job_config& config);

}  // namespace troupe::actors
