#include "actors/cluster/control_schema.h"

#include <cstdint>
#include <limits>
#include <map>

namespace troupe::actors {

using json = nlohmann::json;

namespace {

/// Fields any control message may carry: the sender's address, pid and clock stamps.
const std::vector<control_field> common_fields = {{"address", control_field_kind::string},
                                                  {"pid", control_field_kind::natural},
                                                  {"clock_s", control_field_kind::number},
                                                  {"sent_s", control_field_kind::number},
                                                  {"echo", control_field_kind::object}};

/// Each control message type and the kinds of the fields it carries besides the common ones.
const std::map<std::string, std::vector<control_field>>& typed_fields() {
  static const std::map<std::string, std::vector<control_field>> fields = {
      {"hello",
       {{"protocol", control_field_kind::index},
        {"job_hash", control_field_kind::string},
        {"host", control_field_kind::string},
        {"public_key", control_field_kind::string},
        {"secret", control_field_kind::string}}},
      {"heartbeat",
       {{"activity", control_field_kind::array}, {"spans", control_field_kind::array}}},
      {"ready",
       {{"stages", control_field_kind::indices}, {"job_id", control_field_kind::identifier}}},
      {"report",
       {{"stage", control_field_kind::index},
        {"version", control_field_kind::natural},
        {"peak_contexts", control_field_kind::natural},
        {"peak_activation_bytes", control_field_kind::natural},
        {"staleness", control_field_kind::naturals},
        {"weight_staleness", control_field_kind::naturals},
        {"replica_staleness", control_field_kind::naturals}}},
      {"trace",
       {{"stages", control_field_kind::indices}, {"clock_offset_s", control_field_kind::number}}},
      {"usage",
       {{"role", control_field_kind::string},
        {"host", control_field_kind::string},
        {"stages", control_field_kind::indices},
        {"user_s", control_field_kind::number},
        {"system_s", control_field_kind::number},
        {"voluntary_switches", control_field_kind::number},
        {"involuntary_switches", control_field_kind::number}}},
      {"assign",
       {{"job_toml", control_field_kind::string},
        {"overrides", control_field_kind::strings},
        {"stages", control_field_kind::indices},
        {"addresses", control_field_kind::strings},
        {"keys", control_field_kind::strings},
        {"coordinator", control_field_kind::string},
        {"coordinator_key", control_field_kind::string},
        {"job_id", control_field_kind::identifier},
        {"steps_per_epoch", control_field_kind::natural},
        {"total_steps", control_field_kind::natural},
        {"group_ids", control_field_kind::strings}}},
      {"refuse", {{"reason", control_field_kind::string}, {"retry_s", control_field_kind::number}}},
      {"stop", {{"reason", control_field_kind::string}}},
      {"reset", {{"job_id", control_field_kind::identifier}}},
      {"finish", {{"job_id", control_field_kind::identifier}}},
  };
  return fields;
}

/// What `value` is, for a message: a number as written (cut short), else its JSON type.
std::string described(const json& value) {
  if (!value.is_number()) return value.type_name();
  const std::string text = value.dump();
  return text.size() <= 32 ? text : text.substr(0, 32) + "...";
}

/// Whether `value` is an integer from 0 to `most`. nlohmann::json keeps an integer beyond
/// int64_t's range as unsigned, and one beyond uint64_t's as a float (not an integer).
bool natural_up_to(const json& value, uint64_t most) {
  if (value.is_number_unsigned()) return value.get<uint64_t>() <= most;
  return value.is_number_integer() && value.get<int64_t>() >= 0 &&
         static_cast<uint64_t>(value.get<int64_t>()) <= most;
}

bool is_index(const json& value) { return natural_up_to(value, std::numeric_limits<int>::max()); }
bool is_natural(const json& value) {
  return natural_up_to(value, std::numeric_limits<int64_t>::max());
}
bool is_identifier(const json& value) {
  return natural_up_to(value, std::numeric_limits<uint64_t>::max());
}

/// Each kind: how a message describes it, the test a value (or each element of an array
/// kind) passes, and whether it is an array kind.
struct kind_rule {
  const char* name;
  bool (*holds)(const json& value);
  bool array = false;
};

const kind_rule& rule_of(control_field_kind kind) {
  static const kind_rule rules[] = {
      {"a string", [](const json& v) { return v.is_string(); }},
      {"an integer from 0 to 2147483647", is_index},
      {"an integer from 0 to 9223372036854775807", is_natural},
      {"an integer from 0 to 18446744073709551615", is_identifier},
      {"a number", [](const json& v) { return v.is_number(); }},
      {"an object", [](const json& v) { return v.is_object(); }},
      {"an array of integers from 0 to 2147483647", is_index, true},
      {"an array of integers from 0 to 9223372036854775807", is_natural, true},
      {"an array of strings", [](const json& v) { return v.is_string(); }, true},
      {"an array", [](const json& v) { return v.is_array(); }},
  };
  return rules[static_cast<int>(kind)];
}

/// Why `value` is not of `rule`'s kind, after "got": its type or value, or the first element
/// of an array that is not; "" when it is.
std::string kind_problem(const json& value, const kind_rule& rule) {
  if (!rule.array) return rule.holds(value) ? "" : described(value);
  if (!value.is_array()) return described(value);
  for (size_t i = 0; i < value.size(); ++i) {
    if (!rule.holds(value[i])) return described(value[i]) + " at [" + std::to_string(i) + "]";
  }
  return "";
}

/// The first field of `rules` that `body` carries with another kind, described; "" if none.
std::string field_problem(const json& body, const std::vector<control_field>& rules) {
  for (const control_field& rule : rules) {
    const auto found = body.find(rule.name);
    if (found == body.end()) continue;
    const kind_rule& kind = rule_of(rule.kind);
    const std::string problem = kind_problem(*found, kind);
    if (problem.empty()) continue;
    return std::string("field '") + rule.name + "' must be " + kind.name + ", got " + problem;
  }
  return "";
}

}  // namespace

std::optional<std::vector<control_field>> control_fields(const std::string& type) {
  const auto rules = typed_fields().find(type);
  if (rules == typed_fields().end()) return std::nullopt;
  std::vector<control_field> fields = common_fields;
  fields.insert(fields.end(), rules->second.begin(), rules->second.end());
  return fields;
}

std::string control_body_problem(const json& body) {
  if (!body.is_object()) return std::string("not a JSON object but ") + body.type_name();
  const auto type = body.find("type");
  if (type == body.end() || !type->is_string()) return "no \"type\" string";
  const auto rules = typed_fields().find(type->get<std::string>());
  if (rules == typed_fields().end())
    return "unknown type '" + type->get<std::string>().substr(0, 64) + "'";
  std::string problem = field_problem(body, common_fields);
  if (problem.empty()) problem = field_problem(body, rules->second);
  return problem.empty() ? "" : "a " + type->get<std::string>() + " message whose " + problem;
}

}  // namespace troupe::actors
