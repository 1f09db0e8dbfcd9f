#include "actors/engine/graph_routes.h"

#include <algorithm>

#include "layers/check.h"

namespace troupe::actors {

key_layout layout_of(const std::vector<layers::instance>& instances) {
  key_layout layout;
  layout.first_part.reserve(instances.size() + 1);
  int64_t total = 0;
  for (const layers::instance& item : instances) {
    layout.first_part.push_back(total);
    total += item.parts();
  }
  layout.first_part.push_back(total);
  return layout;
}

namespace {

/// Per part row: its children's part rows (arity slots, -1 where absent) and its parent's
/// part row (-1 for a root).
struct key_structure {
  std::vector<int64_t> children;
  std::vector<int64_t> parent;
};

key_structure structure_of(const std::vector<layers::instance>& instances, const key_layout& layout,
                           int arity) {
  key_structure structure;
  structure.children.assign(static_cast<size_t>(layout.parts() * arity), -1);
  structure.parent.assign(static_cast<size_t>(layout.parts()), -1);
  std::vector<int> filled(static_cast<size_t>(layout.parts()), 0);
  for (size_t i = 0; i < instances.size(); ++i) {
    const layers::instance& item = instances[i];
    const int64_t first = layout.first_part[i];
    for (int64_t part = 0; part < item.parts(); ++part) {
      const int32_t parent = item.parent_of(part);
      if (parent < 0) continue;
      const int64_t row = first + parent;
      int& slot = filled[static_cast<size_t>(row)];
      TROUPE_CHECK(slot < arity);  // instance_error() refuses more children than the arity
      structure.children[static_cast<size_t>(row * arity + slot++)] = first + part;
      structure.parent[static_cast<size_t>(first + part)] = row;
    }
  }
  return structure;
}

}  // namespace

recurrence_plan plan_recurrence(const std::vector<layers::instance>& instances, int arity,
                                node_emit emit) {
  const key_layout layout = layout_of(instances);
  const key_structure structure = structure_of(instances, layout, arity);
  const size_t parts = static_cast<size_t>(layout.parts());
  recurrence_plan plan;
  plan.arity = arity;
  // The join: a part is ready once its children are done; each visit takes every ready part.
  std::vector<int> waiting(parts, 0);
  for (int64_t child_row : structure.children) {
    if (child_row >= 0) ++waiting[static_cast<size_t>(structure.parent[child_row])];
  }
  std::vector<int64_t> ready;
  for (size_t row = 0; row < parts; ++row) {
    if (waiting[row] == 0) ready.push_back(static_cast<int64_t>(row));
  }
  while (!ready.empty()) {
    visit_plan visit;
    visit.parts = ready;
    std::vector<int64_t> next;
    for (int64_t row : ready) {
      for (int k = 0; k < arity; ++k)
        visit.children.push_back(structure.children[static_cast<size_t>(row * arity + k)]);
      // The conditional: a root leaves, any other part goes on to its parent's join.
      const int64_t parent = structure.parent[static_cast<size_t>(row)];
      if (parent >= 0 && --waiting[static_cast<size_t>(parent)] == 0) next.push_back(parent);
    }
    plan.visits.push_back(std::move(visit));
    std::sort(next.begin(), next.end());
    ready = std::move(next);
  }
  // The gather: what leaves, in key order (broadcast: every part's output also left).
  for (size_t row = 0; row < parts; ++row) {
    if (emit == node_emit::every || structure.parent[row] < 0)
      plan.emitted.push_back(static_cast<int64_t>(row));
  }
  return plan;
}

int64_t rows_of(const key_layout& layout, row_unit unit) {
  return unit == row_unit::part ? layout.parts() : layout.instances();
}

std::vector<int32_t> row_labels(const std::vector<layers::instance>& instances, row_unit unit,
                                std::string* error) {
  std::vector<int32_t> labels;
  for (size_t i = 0; i < instances.size(); ++i) {
    const layers::instance& item = instances[i];
    const size_t wanted = unit == row_unit::part ? static_cast<size_t>(item.parts()) : 1;
    if (item.labels.size() != wanted) {
      *error = "instance " + std::to_string(i) + " has " + std::to_string(item.labels.size()) +
               " labels where the model's last node gives " + std::to_string(wanted) +
               (unit == row_unit::part ? " rows (one per part)" : " row (one per instance)");
      return {};
    }
    labels.insert(labels.end(), item.labels.begin(), item.labels.end());
  }
  return labels;
}

}  // namespace troupe::actors
