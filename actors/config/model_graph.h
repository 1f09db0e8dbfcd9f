#pragma once

// A model may be a graph of nodes instead of a chain of blocks: `[[model.nodes]]` in a job
// file. Each node is a chain of blocks that runs on rows (one per part of an instance, or one
// per instance), and a route that says which rows it runs on and where its output goes, decided
// per instance from the instance's own structure (layers/instance.h). Nothing is padded: a key
// is a group of instances of any sizes, and a node runs on the rows that are ready.
//
// The first node takes one row per part holding the part's token (as a float, like an
// embedding's input); the last node's rows go to the loss, with the labels of the parts (or
// instances) they stand for.

#include <string>
#include <vector>

#include "layers/layer_spec.h"

namespace troupe::actors {

/// model.nodes[].route: how a node's visits follow each instance's structure.
enum class node_route {
  /// Rows in, rows out: one visit over every row the node before emitted.
  chain,
  /// A sequence's positions in order (a loop): part t's row is its own input followed by the
  /// node's output for part t − 1 (zeros for the first), and the node is visited again with
  /// part t + 1 until the instance's own length is reached. The weights are shared by every
  /// visit and their gradients summed over them.
  loop,
  /// A tree bottom-up (a join): a node's row is its own input followed by the node's outputs
  /// for its children, in order (zeros for missing children: a leaf), and it is visited once
  /// all of them have been. The root's output leaves the loop.
  tree,
};

/// model.nodes[].emit (loop and tree nodes): whose outputs go on to `next`.
enum class node_emit {
  /// Every part's (a language model's head on every position).
  every,
  /// Only the root's (the last position of a sequence, a tree's root): one row per instance.
  root,
};

/// One node of `model.nodes`.
struct graph_node_spec {
  std::string name;
  std::vector<layers::layer_spec> layers;
  node_route route = node_route::chain;
  node_emit emit = node_emit::every;
  /// The node the emitted rows go to; empty on the last node, whose rows go to the loss.
  std::string next;
};

}  // namespace troupe::actors
