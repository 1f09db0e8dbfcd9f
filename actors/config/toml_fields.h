#pragma once

// Generic reading of TOML tables into typed configuration fields: readers of one value with range
// checks, tables of known keys with "did you mean" suggestions for unknown ones, and
// `section.key=value` overrides. Internal to actors/ (job_schema.cpp builds the job schema from
// these). Bad input comes back as a one-line message (a `problem`), not as an exception.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

namespace troupe::actors::detail {

/// A message without the source name in front; nothing when all is well.
using problem = std::optional<std::string>;
/// Reads one node into the configuration; `label` names the key in messages.
using reader = std::function<problem(const toml::node& node, const std::string& label)>;
/// The configuration's current value of one key, as to_json() writes it.
using writer = std::function<nlohmann::json()>;

/// One key a table may hold. The job schema is the single list of job-file keys: reading,
/// unknown-key suggestions, to_json(), `troupe keys` and docs/guide/job-file.md all walk it.
struct field {
  std::string name;
  reader read;
  writer write;
  bool required = false;
  std::string description{};           ///< one line: what the key does
  std::string default_meaning{};       ///< what a special default stands for ("every core")
  std::vector<std::string> choices{};  ///< the values a closed set accepts (none: any)
  bool expert = false;                 ///< tuning that most jobs leave alone
  /// When set, config.json holds the key only while this is true: keys added after jobs were
  /// hashed are left out where they do nothing, so that those jobs' hashes stay as they were.
  std::function<bool()> written_if{};

  /// This field with its one-line description.
  field about(std::string text) && {
    description = std::move(text);
    return std::move(*this);
  }
  /// This field with what its default stands for, where 0 or -1 means more than the number.
  field default_means(std::string text) && {
    default_meaning = std::move(text);
    return std::move(*this);
  }
  /// This field marked as tuning that most jobs leave alone.
  field for_experts() && {
    expert = true;
    return std::move(*this);
  }
  /// This field written to config.json only while `condition` holds.
  field written_only_if(std::function<bool()> condition) && {
    written_if = std::move(condition);
    return std::move(*this);
  }
  /// Whether config.json holds this key now.
  bool is_written() const { return !written_if || written_if(); }
};

/// A top-level table of the job file and the keys it may hold.
struct section {
  std::string name;
  std::vector<field> fields;
};

/// How read_fields() names what it reads: "training.lr", or "model.layers[2] (conv2d): out".
struct naming {
  std::string context;     ///< in front of every message ("" or "model.layers[2] (conv2d): ")
  std::string key_prefix;  ///< in front of every key ("training." or "")
  std::vector<std::string> suggestions;     ///< full key names offered for unknown keys
  const std::set<std::string>* overridden;  ///< full keys set by --set (may be null)
};

/// An interval of accepted numbers and how messages spell it.
struct number_range {
  double low, high;
  bool low_open, high_open;
  const char* text;

  bool contains(double v) const {
    return (low_open ? v > low : v >= low) && (high_open ? v < high : v <= high);
  }
};

inline constexpr double kInfinity = std::numeric_limits<double>::infinity();
inline constexpr number_range kPositive{0, kInfinity, true, false, "> 0"};
inline constexpr number_range kNonNegative{0, kInfinity, false, false, ">= 0"};
inline constexpr number_range kBelowOne{0, 1, false, true, "in [0, 1)"};
inline constexpr number_range kUnit{0, 1, false, false, "in [0, 1]"};
inline constexpr number_range kAnyNumber{-kInfinity, kInfinity, false, false, "finite"};

/// "LABEL must be EXPECTED, got a string" (or "an integer", "a float", ...).
problem wrong_type(const std::string& label, const std::string& expected, const toml::node& node);

/// The shortest decimal that reads back as `value`.
std::string format_number(double value);

/// `text` without leading and trailing spaces, tabs and line ends.
std::string trim(const std::string& text);

/// "; did you mean 'X'?" for the closest candidate within two edits (or, failing that, one whose
/// last dotted part equals the typed one's, such as 'parallelism.devices' for 'training.devices'),
/// else "".
std::string suggestion(const std::string& typed, const std::vector<std::string>& candidates);

// Readers of one value ---------------------------------------------------------------------------

/// An integer in [min, max].
problem read_integer(const toml::node& node, const std::string& label, int64_t min, int64_t max,
                     int64_t* out);

/// A finite number in `range`; integers are accepted where a number is expected.
problem read_number(const toml::node& node, const std::string& label, const number_range& range,
                    double* out);

/// A string, one of `choices` unless `choices` is empty.
problem read_string(const toml::node& node, const std::string& label,
                    const std::vector<std::string>& choices, std::string* out);

problem read_bool(const toml::node& node, const std::string& label, bool* out);

/// An integer in [1, INT_MAX].
problem read_positive(const toml::node& node, const std::string& label, int64_t* out);

/// Reads a non-empty array whose elements `read_element` reads; elements are named "label[i]".
template <typename T, typename Read>
problem read_array(const toml::node& node, const std::string& label, const std::string& expected,
                   Read read_element, std::vector<T>* out) {
  const auto* array = node.as_array();
  if (array == nullptr) return wrong_type(label, expected, node);
  if (array->empty()) return label + " must not be empty";
  std::vector<T> values(array->size());
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string element = label + "[" + std::to_string(i) + "]";
    if (problem error = read_element(*array->get(i), element, &values[i])) return error;
  }
  return *out = std::move(values), std::nullopt;
}

// Field builders: each binds a key to the configuration member it reads and writes --------------

template <typename T>
writer write_value(const T* target) {
  return [target] { return nlohmann::json(*target); };
}

/// The largest value of T that an int64_t holds.
template <typename T>
constexpr int64_t largest() {
  return static_cast<int64_t>(
      std::min<uint64_t>(std::numeric_limits<T>::max(), std::numeric_limits<int64_t>::max()));
}

template <typename T>
field integer_field(std::string name, T* target, int64_t min, int64_t max = largest<T>()) {
  auto read = [target, min, max](const toml::node& node, const std::string& label) {
    int64_t value = 0;
    problem error = read_integer(node, label, min, max, &value);
    if (!error) *target = static_cast<T>(value);
    return error;
  };
  return {std::move(name), read, write_value(target)};
}

field number_field(std::string name, double* target, const number_range& range);

/// A string key; any string when `choices` is empty.
field string_field(std::string name, std::string* target, std::vector<std::string> choices = {});

field bool_field(std::string name, bool* target);

/// `f`, with a missing key an error instead of the default.
field required(field f);

/// Reads every key of `table` named by `fields` (a key missing from `table` keeps its default)
/// and rejects any other key except those in `ignored`.
problem read_fields(const toml::table& table, const std::vector<field>& fields, const naming& names,
                    const std::vector<std::string>& ignored = {});

// Text in: TOML and overrides --------------------------------------------------------------------

/// Parses `text`; on a syntax error returns "SOURCE:LINE:COLUMN: invalid TOML: ...".
problem parse_toml(const std::string& text, const std::string& source, toml::table* root);

/// `{ v = VALUE }`: VALUE read as TOML when `v = VALUE` is a document with that one key, else
/// the text itself as a string (an override's value).
toml::table parse_override_value(const std::string& text);

/// Applies "section.key=value" to `root`, creating the section when it is missing, and adds
/// "section.key" to `overridden`. VALUE is read as TOML, or as a plain string when it is not.
problem apply_override(const std::string& text, toml::table* root,
                       std::set<std::string>* overridden);

}  // namespace troupe::actors::detail
