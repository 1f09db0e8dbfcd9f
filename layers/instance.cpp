// Checks of instances against the contract in instance.h.

#include "layers/instance.h"

#include "layers/backend.h"

namespace troupe::layers {
namespace {

std::string part_name(int64_t part) { return "part " + std::to_string(part); }

std::string range_error(const std::string& what, int64_t value, int bound) {
  return what + " " + std::to_string(value) + " is outside [0, " + std::to_string(bound) + ")";
}

std::string token_error(const instance_dataset& data, const instance& item) {
  for (int64_t part = 0; part < item.parts(); ++part) {
    const int32_t token = item.tokens[static_cast<size_t>(part)];
    if (token < 0 || token >= data.vocabulary)
      return range_error(part_name(part) + "'s token", token, data.vocabulary);
  }
  return {};
}

std::string label_error(const instance_dataset& data, const instance& item) {
  const auto count = static_cast<int64_t>(item.labels.size());
  if (count != 1 && count != item.parts())
    return std::to_string(count) + " labels for " + std::to_string(item.parts()) +
           " parts (one label for the instance, or one per part)";
  for (int64_t i = 0; i < count; ++i) {
    const int32_t label = item.labels[static_cast<size_t>(i)];
    if (label != ignored_label && (label < 0 || label >= data.classes))
      return range_error("label " + std::to_string(i), label, data.classes);
  }
  return {};
}

/// Parents after their children, the last part the one root, no part over the arity.
std::string structure_error(const instance_dataset& data, const instance& item) {
  const int64_t parts = item.parts();
  if (item.is_sequence())
    return parts > 1 && data.arity < 1 ? "a sequence needs an arity of at least 1" : "";
  if (static_cast<int64_t>(item.parent.size()) != parts)
    return std::to_string(item.parent.size()) + " parents for " + std::to_string(parts) + " parts";
  std::vector<int> children(static_cast<size_t>(parts), 0);
  for (int64_t part = 0; part < parts; ++part) {
    const int32_t parent = item.parent[static_cast<size_t>(part)];
    const bool last = part + 1 == parts;
    if (last && parent != -1) return "the last " + part_name(part) + " is not the root";
    if (last) break;
    if (parent == -1) return part_name(part) + " is a second root (only the last part is one)";
    if (parent <= part || parent >= parts)
      return part_name(part) + "'s parent " + std::to_string(parent) +
             " does not come after it within the instance";
    if (++children[static_cast<size_t>(parent)] > data.arity)
      return part_name(parent) + " has more children than the arity " + std::to_string(data.arity);
  }
  return {};
}

}  // namespace

int64_t instance_dataset::total_parts() const {
  int64_t total = 0;
  for (const instance& item : instances) total += item.parts();
  return total;
}

std::string instance_error(const instance_dataset& data, const instance& item) {
  if (item.parts() == 0) return "the instance has no parts";
  std::string error = token_error(data, item);
  if (error.empty()) error = structure_error(data, item);
  if (error.empty()) error = label_error(data, item);
  return error;
}

}  // namespace troupe::layers
