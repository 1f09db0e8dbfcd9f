#include "actors/config/toml_fields.h"

#include <charconv>
#include <cmath>
#include <sstream>
#include <string_view>

namespace troupe::actors::detail {
namespace {

/// "a string", "an integer", "a float", "a date-time", ...
std::string describe(const toml::node& node) {
  std::ostringstream name;
  name << node.type();
  const std::string text = node.is_floating_point() ? "float" : name.str();
  return (text[0] == 'a' || text[0] == 'i' ? "an " : "a ") + text;
}

/// Optimal string alignment distance: insertions, deletions, substitutions, transpositions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string last_part(const std::string& key) { return key.substr(key.rfind('.') + 1); }

}  // namespace

problem wrong_type(const std::string& label, const std::string& expected, const toml::node& node) {
  return label + " must be " + expected + ", got " + describe(node);
}

std::string format_number(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

std::string suggestion(const std::string& typed, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  size_t best_distance = 3;
  for (const auto& candidate : candidates) {
    const size_t distance = edit_distance(typed, candidate);
    if (distance < best_distance) best = &candidate, best_distance = distance;
  }
  for (const auto& candidate : candidates) {
    if (best == nullptr && last_part(candidate) == last_part(typed)) best = &candidate;
  }
  return best == nullptr ? "" : "; did you mean '" + *best + "'?";
}

// Readers of one value ---------------------------------------------------------------------------

problem read_integer(const toml::node& node, const std::string& label, int64_t min, int64_t max,
                     int64_t* out) {
  const auto* value = node.as_integer();
  if (value == nullptr) return wrong_type(label, "an integer", node);
  const int64_t number = value->get();
  if (number >= min && number <= max) return *out = number, std::nullopt;
  std::string range = "in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  if (max >= std::numeric_limits<int>::max()) {
    range = number < min ? ">= " + std::to_string(min) : "<= " + std::to_string(max);
  }
  return label + " must be " + range + ", got " + std::to_string(number);
}

problem read_number(const toml::node& node, const std::string& label, const number_range& range,
                    double* out) {
  double number = 0;
  if (const auto* integer = node.as_integer()) {
    number = static_cast<double>(integer->get());
  } else if (const auto* floating = node.as_floating_point()) {
    number = floating->get();
  } else {
    return wrong_type(label, "a number", node);
  }
  const std::string got = ", got " + format_number(number);
  if (!std::isfinite(number)) return label + " must be a finite number" + got;
  if (!range.contains(number)) return label + " must be " + range.text + got;
  return *out = number, std::nullopt;
}

problem read_string(const toml::node& node, const std::string& label,
                    const std::vector<std::string>& choices, std::string* out) {
  const auto* value = node.as_string();
  if (value == nullptr) return wrong_type(label, "a string", node);
  const std::string& text = value->get();
  if (choices.empty() || std::count(choices.begin(), choices.end(), text) > 0) {
    return *out = text, std::nullopt;
  }
  std::string listed;
  for (const auto& choice : choices) listed += (listed.empty() ? "'" : ", '") + choice + "'";
  return label + " must be one of " + listed + ", got '" + text + "'" + suggestion(text, choices);
}

problem read_bool(const toml::node& node, const std::string& label, bool* out) {
  const auto* value = node.as_boolean();
  if (value == nullptr) return wrong_type(label, "a boolean", node);
  return *out = value->get(), std::nullopt;
}

problem read_positive(const toml::node& node, const std::string& label, int64_t* out) {
  return read_integer(node, label, 1, std::numeric_limits<int>::max(), out);
}

// Field builders ---------------------------------------------------------------------------------

field number_field(std::string name, double* target, const number_range& range) {
  auto read = [target, range](const toml::node& node, const std::string& label) {
    return read_number(node, label, range, target);
  };
  return {std::move(name), read, write_value(target)};
}

field string_field(std::string name, std::string* target, std::vector<std::string> choices) {
  auto read = [target, choices](const toml::node& node, const std::string& label) {
    return read_string(node, label, choices, target);
  };
  field f{std::move(name), read, write_value(target)};
  f.choices = std::move(choices);
  return f;
}

field bool_field(std::string name, bool* target) {
  auto read = [target](const toml::node& node, const std::string& label) {
    return read_bool(node, label, target);
  };
  return {std::move(name), read, write_value(target)};
}

field required(field f) {
  f.required = true;
  return f;
}

problem read_fields(const toml::table& table, const std::vector<field>& fields, const naming& names,
                    const std::vector<std::string>& ignored) {
  auto from_override = [&](const std::string& key) {
    return names.overridden != nullptr && names.overridden->count(key) ? " (from --set)" : "";
  };
  for (const auto& [key, node] : table) {
    const std::string name(key.str());
    const std::string full = names.key_prefix + name;
    const bool known =
        std::any_of(fields.begin(), fields.end(), [&](const field& f) { return f.name == name; });
    if (!known && std::count(ignored.begin(), ignored.end(), name) == 0) {
      return names.context + "unknown key '" + full + "'" + from_override(full) +
             suggestion(full, names.suggestions);
    }
  }
  for (const auto& f : fields) {
    const std::string full = names.key_prefix + f.name;
    const toml::node* node = table.get(f.name);
    if (node == nullptr && f.required) return names.context + "missing required key '" + full + "'";
    if (node == nullptr) continue;
    if (problem error = f.read(*node, names.context + full)) return *error + from_override(full);
  }
  return std::nullopt;
}

// Text in: TOML and overrides --------------------------------------------------------------------

toml::table parse_override_value(const std::string& text) {
  try {
    toml::table parsed = toml::parse(std::string_view("v = " + text));
    if (parsed.size() == 1 && parsed.contains("v")) return parsed;
  } catch (const toml::parse_error&) {
  }
  toml::table fallback;
  fallback.insert("v", text);
  return fallback;
}

problem parse_toml(const std::string& text, const std::string& source, toml::table* root) {
  try {
    *root = toml::parse(std::string_view(text), std::string_view(source));
    return std::nullopt;
  } catch (const toml::parse_error& error) {
    const toml::source_position& begin = error.source().begin;
    std::string description(error.description());
    std::replace(description.begin(), description.end(), '\n', ' ');
    return source + ":" + std::to_string(begin.line) + ":" + std::to_string(begin.column) +
           ": invalid TOML: " + description;
  }
}

problem apply_override(const std::string& text, toml::table* root,
                       std::set<std::string>* overridden) {
  const size_t equals = text.find('=');
  const std::string key = trim(text.substr(0, equals));
  const size_t dot = key.find('.');
  if (equals == std::string::npos || dot == std::string::npos || dot == 0 ||
      dot + 1 == key.size() || key.find('.', dot + 1) != std::string::npos) {
    return "malformed override '" + text + "': expected section.key=value";
  }
  try {
    (void)nlohmann::json(text).dump();  // a fallback string must be valid UTF-8 for config.json
  } catch (const nlohmann::json::exception&) {
    return "override of '" + key + "' is not valid UTF-8";
  }
  const std::string section = key.substr(0, dot);
  if (!root->contains(section)) root->insert(section, toml::table{});
  toml::table* table = root->get_as<toml::table>(section);
  if (table == nullptr) return wrong_type(section, "a table", *root->get(section));
  toml::table value = parse_override_value(trim(text.substr(equals + 1)));
  table->insert_or_assign(key.substr(dot + 1), std::move(*value.get("v")));
  overridden->insert(key);
  return std::nullopt;
}

}  // namespace troupe::actors::detail
