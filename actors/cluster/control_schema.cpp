#include "actors/cluster/control_schema.h"

#include <map>

namespace troupe::actors {

using json = nlohmann::json;

namespace {

/// Fields any control message may carry: the sender's address, pid and clock stamps.
const std::vector<control_field> common_fields = {{"address", control_field_kind::string},
                                                  {"pid", control_field_kind::integer},
                                                  {"clock_s", control_field_kind::number},
                                                  {"sent_s", control_field_kind::number},
                                                  {"echo", control_field_kind::object}};

/// Each control message type and the kinds of the fields it carries besides the common ones.
const std::map<std::string, std::vector<control_field>>& typed_fields() {
  static const std::map<std::string, std::vector<control_field>> fields = {
      {"hello",
       {{"protocol", control_field_kind::integer},
        {"job_hash", control_field_kind::string},
        {"host", control_field_kind::string},
        {"public_key", control_field_kind::string}}},
      {"heartbeat",
       {{"activity", control_field_kind::array}, {"spans", control_field_kind::array}}},
      {"ready",
       {{"stages", control_field_kind::integers},
        {"job_id", control_field_kind::unsigned_integer}}},
      {"report",
       {{"stage", control_field_kind::integer},
        {"version", control_field_kind::integer},
        {"peak_contexts", control_field_kind::unsigned_integer},
        {"peak_activation_bytes", control_field_kind::integer},
        {"staleness", control_field_kind::integers},
        {"weight_staleness", control_field_kind::integers},
        {"replica_staleness", control_field_kind::integers}}},
      {"trace",
       {{"stages", control_field_kind::integers}, {"clock_offset_s", control_field_kind::number}}},
      {"usage",
       {{"role", control_field_kind::string},
        {"host", control_field_kind::string},
        {"stages", control_field_kind::integers},
        {"user_s", control_field_kind::number},
        {"system_s", control_field_kind::number},
        {"voluntary_switches", control_field_kind::number},
        {"involuntary_switches", control_field_kind::number}}},
      {"assign",
       {{"job_toml", control_field_kind::string},
        {"overrides", control_field_kind::strings},
        {"stages", control_field_kind::integers},
        {"addresses", control_field_kind::strings},
        {"keys", control_field_kind::strings},
        {"coordinator", control_field_kind::string},
        {"coordinator_key", control_field_kind::string},
        {"job_id", control_field_kind::unsigned_integer},
        {"steps_per_epoch", control_field_kind::integer},
        {"total_steps", control_field_kind::integer},
        {"group_ids", control_field_kind::strings}}},
      {"refuse", {{"reason", control_field_kind::string}}},
      {"stop", {{"reason", control_field_kind::string}}},
      {"reset", {{"job_id", control_field_kind::unsigned_integer}}},
      {"finish", {{"job_id", control_field_kind::unsigned_integer}}},
  };
  return fields;
}

/// Whether `value` is an array whose every element satisfies `test`.
template <typename Test>
bool all_of(const json& value, Test test) {
  if (!value.is_array()) return false;
  for (const json& element : value)
    if (!test(element)) return false;
  return true;
}

/// Each kind: how a message describes it, and the test a value of it passes.
struct kind_rule {
  const char* name;
  bool (*holds)(const json& value);
};

const kind_rule& rule_of(control_field_kind kind) {
  static const kind_rule rules[] = {
      {"a string", [](const json& v) { return v.is_string(); }},
      {"an integer", [](const json& v) { return v.is_number_integer(); }},
      {"a non-negative integer", [](const json& v) { return v.is_number_unsigned(); }},
      {"a number", [](const json& v) { return v.is_number(); }},
      {"an object", [](const json& v) { return v.is_object(); }},
      {"an array of integers",
       [](const json& v) {
         return all_of(v, [](const json& e) { return e.is_number_integer(); });
       }},
      {"an array of strings",
       [](const json& v) { return all_of(v, [](const json& e) { return e.is_string(); }); }},
      {"an array", [](const json& v) { return v.is_array(); }},
  };
  return rules[static_cast<int>(kind)];
}

/// The first field of `rules` that `body` carries with another kind, described; "" if none.
std::string field_problem(const json& body, const std::vector<control_field>& rules) {
  for (const control_field& rule : rules) {
    const auto found = body.find(rule.name);
    if (found == body.end() || rule_of(rule.kind).holds(*found)) continue;
    return std::string("field '") + rule.name + "' must be " + rule_of(rule.kind).name + ", got " +
           found->type_name();
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
