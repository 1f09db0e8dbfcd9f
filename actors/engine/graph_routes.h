#pragma once

// The routing rules of a model graph (config/model_graph.h), as AMPNet's IR has them, with no
// device and no I/O: what a node runs on for one key is decided from the key's instances alone
// (layers/instance.h), so every stage, the oracle and the simulator take the very same route.
//
// - split: a key's instances become rows, one per part, instance after instance, each
//   instance's parts in order (the key's part rows);
// - join: a loop or tree node visits a part once the node's outputs for all of the part's
//   children are in (a sequence's previous position, a tree node's subtrees);
// - loop / conditional: after its visit a part goes on to its parent's join, or leaves the
//   loop when it is its instance's root (the last position, the tree's root);
// - broadcast: with emit = every, a part's output goes both to its parent and out;
// - gather: the outputs that leave are collected in the key's part order.
// The visits group the ready parts of every instance of the key (a sequence's position t of
// every instance at once, a tree's nodes level by level), so nothing waits for padding.

#include <cstdint>
#include <string>
#include <vector>

#include "actors/config/model_graph.h"
#include "layers/instance.h"

namespace troupe::actors {

/// Whether a node's rows stand for parts or for whole instances (after a node that emits roots).
enum class row_unit { part, instance };

/// The key's part rows (split): instance i's parts are rows [first_part[i], first_part[i + 1]).
struct key_layout {
  std::vector<int64_t> first_part;  ///< one per instance, and the total at the end

  int64_t instances() const { return static_cast<int64_t>(first_part.size()) - 1; }
  int64_t parts() const { return first_part.back(); }
};
key_layout layout_of(const std::vector<layers::instance>& instances);

/// One visit of a loop or tree node: the parts it runs on, each with the parts whose outputs
/// it joins.
struct visit_plan {
  std::vector<int64_t> parts;  ///< part rows, in key order
  /// parts.size() × arity part rows: child k of parts[r] at [r · arity + k], -1 where the part
  /// has no such child (its state is zeros).
  std::vector<int64_t> children;
};

/// A loop or tree node's route over one key.
struct recurrence_plan {
  int arity = 1;
  /// Every part once, each after all of its children (join), ready parts grouped.
  std::vector<visit_plan> visits;
  /// The part rows whose outputs leave the node, in key order (gather): every part, or each
  /// instance's root.
  std::vector<int64_t> emitted;
};

/// The route of a loop (arity 1) or tree node over `instances`, which must be well formed
/// (layers::instance_error) with at most `arity` children per part.
recurrence_plan plan_recurrence(const std::vector<layers::instance>& instances, int arity,
                                node_emit emit);

/// The rows a node gets for a key: one per part, or one per instance once a node before it
/// emitted roots only.
int64_t rows_of(const key_layout& layout, row_unit unit);

/// The label of each row the last node gives the loss, in row order: a part's own (language
/// models) or its instance's (classes). Empty with `error` set when the instances' labels do
/// not fit the rows (one label per part, or one per instance).
std::vector<int32_t> row_labels(const std::vector<layers::instance>& instances, row_unit unit,
                                std::string* error);

}  // namespace troupe::actors
