#pragma once

// Instances of dynamic models: each training example has its own length or tree, and nothing
// is padded. An instance is a set of parts (a sequence's positions, a tree's nodes), each with
// one token; a part's children are the parts whose states it combines (the position before it,
// a tree node's subtrees). Parts are stored children first, so a part's children always come
// before it (a post-order walk of a tree; positions in order for a sequence).

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::layers {

/// One training example of a dynamic model.
struct instance {
  /// One token per part.
  std::vector<int32_t> tokens;
  /// The part each part feeds, -1 for the root (the last part). Empty: a sequence, where part t
  /// feeds part t + 1. Otherwise one entry per part, each parent after its children, and a
  /// part's children are in the order of their indices (a tree's left subtree before its right).
  std::vector<int32_t> parent;
  /// A class instance (ListOps): one label, the root's. A language-model instance: one per part,
  /// the token that follows it, or ignored_label (layers/backend.h) where padding added the part.
  std::vector<int32_t> labels;

  int64_t parts() const { return static_cast<int64_t>(tokens.size()); }
  bool is_sequence() const { return parent.empty(); }
  /// The part `part` feeds, -1 for the root.
  int32_t parent_of(int64_t part) const {
    if (!parent.empty()) return parent[static_cast<size_t>(part)];
    return part + 1 < parts() ? static_cast<int32_t>(part + 1) : -1;
  }
};

/// A set of instances in host memory, with what a model over them needs to know.
struct instance_dataset {
  std::string name;
  /// Tokens are in [0, vocabulary).
  int vocabulary = 0;
  /// Labels are in [0, classes).
  int classes = 0;
  /// Most children any part has (1 for sequences, 2 for binary trees).
  int arity = 1;
  std::vector<instance> instances;

  int64_t count() const { return static_cast<int64_t>(instances.size()); }
  /// Parts over every instance (the tokens a language model trains on).
  int64_t total_parts() const;
};

/// Why `item` is not a well-formed instance of `data` (a token, or a label other than
/// ignored_label, out of range, a parent that does not come after its child, more children
/// than the arity, not exactly one root, a label count that fits neither kind), or empty when
/// it is.
std::string instance_error(const instance_dataset& data, const instance& item);

/// A training set and the set held out from it (validation or test).
struct instance_splits {
  instance_dataset train;
  instance_dataset validation;
};

}  // namespace troupe::layers
