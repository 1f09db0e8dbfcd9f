// libFuzzer target for the control protocol's JSON (actors/cluster/control_schema.h). The input
// is the text of one control message. No text may crash the parse or the shape check, and the
// check passes exactly the messages whose every named field a handler reads (json::value() or
// get() with the field's C++ type) without an exception and without a change of value: an
// integer its type cannot hold (a stage of 2^40, a step of 2^70, a negative count) is
// rejected, not wrapped. Then, for a message it passes, each field in turn replaced by a value
// of another kind or out of its type's range must make the check fail, naming that field.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/cluster/control_schema.h"

namespace troupe::actors {
namespace {

using json = nlohmann::json;

/// Reads `name` from `body` as a handler does for a field of `kind`; throws if it cannot.
void read_as_handlers_do(const json& body, const char* name, control_field_kind kind) {
  switch (kind) {
    case control_field_kind::string:
      (void)body.value(name, std::string());
      break;
    case control_field_kind::index:
      (void)body.value(name, 0);
      break;
    case control_field_kind::natural:
      (void)body.value(name, int64_t{0});
      (void)body.value(name, size_t{0});
      break;
    case control_field_kind::identifier:
      (void)body.value(name, uint64_t{0});
      break;
    case control_field_kind::number:
      (void)body.value(name, 0.0);
      break;
    case control_field_kind::object:
    case control_field_kind::array:
      (void)body.value(name, json());
      break;
    case control_field_kind::indices:
      (void)body.value(name, std::vector<int>{});
      break;
    case control_field_kind::naturals:
      (void)body.value(name, std::vector<int64_t>{});
      break;
    case control_field_kind::strings:
      (void)body.value(name, std::vector<std::string>{});
      break;
  }
}

/// Whether `value` is a JSON integer that T holds as written and that is not negative: read
/// as T and written again, it is the same text.
template <typename T>
bool holds_unchanged(const json& value) {
  if (!value.is_number_integer()) return false;
  const std::string text = value.dump();
  return text[0] != '-' && json(value.get<T>()).dump() == text;
}

/// Whether `value` is an array whose every element passes `test`.
template <typename Test>
bool every_element(const json& value, Test test) {
  if (!value.is_array()) return false;
  for (const json& element : value) {
    if (!test(element)) return false;
  }
  return true;
}

/// Whether a field of `kind` with `value` reads as its handler reads it, unchanged.
bool readable(const json& value, control_field_kind kind) {
  switch (kind) {
    case control_field_kind::string:
      return value.is_string();
    case control_field_kind::index:
      return holds_unchanged<int>(value);
    case control_field_kind::natural:
      return holds_unchanged<int64_t>(value);
    case control_field_kind::identifier:
      return holds_unchanged<uint64_t>(value);
    case control_field_kind::number:
      return value.is_number();
    case control_field_kind::object:
      return value.is_object();
    case control_field_kind::array:
      return value.is_array();
    case control_field_kind::indices:
      return every_element(value, holds_unchanged<int>);
    case control_field_kind::naturals:
      return every_element(value, holds_unchanged<int64_t>);
    case control_field_kind::strings:
      return every_element(value, [](const json& e) { return e.is_string(); });
  }
  return false;
}

/// Whether the schema must pass `body`: an object with a "type" string the protocol has, each
/// of whose named fields is readable.
bool must_pass(const json& body) {
  if (!body.is_object() || !body.contains("type") || !body["type"].is_string()) return false;
  const auto fields = control_fields(body["type"].get<std::string>());
  if (!fields) return false;
  for (const control_field& field : *fields) {
    if (body.contains(field.name) && !readable(body[field.name], field.kind)) return false;
  }
  return true;
}

/// Values a field of `kind` must not carry: another kind, or an integer its type cannot hold.
std::vector<json> misfits(control_field_kind kind) {
  const json two_to_the_70 = json::parse("1180591620717411303424");  // a float to nlohmann
  const json two_to_the_63 = uint64_t{1} << 63;
  switch (kind) {
    case control_field_kind::string:
      return {7, json::array(), nullptr};
    case control_field_kind::index:
      return {-1, int64_t{1} << 31, int64_t{1} << 40, two_to_the_63, two_to_the_70, 1.5, "3"};
    case control_field_kind::natural:
      return {-1, two_to_the_63, two_to_the_70, 0.5, "7", json::array()};
    case control_field_kind::identifier:
      return {-1, two_to_the_70, 2.0, "1"};
    case control_field_kind::number:
      return {"1", json::array(), nullptr, true};
    case control_field_kind::object:
      return {json::array(), 1};
    case control_field_kind::array:
      return {json::object(), 1};
    case control_field_kind::indices:
      return {3, json::array({0, -1}), json::array({int64_t{1} << 40}), json::array({"a"})};
    case control_field_kind::naturals:
      return {json::array({-1}), json::array({two_to_the_63}), json::array({1.5})};
    case control_field_kind::strings:
      return {"a", json::array({1})};
  }
  return {};
}

/// For a message the schema passes: each field replaced by each misfit of its kind, and the
/// message with no type, an unknown type, or inside an array, are each rejected.
void check_rejections(const json& body) {
  const std::string type = body["type"].get<std::string>();
  const auto fields = control_fields(type);
  for (const control_field& field : *fields) {
    for (const json& misfit : misfits(field.kind)) {
      if (readable(misfit, field.kind)) __builtin_trap();  // the misfits themselves are wrong
      json changed = body;
      changed[field.name] = misfit;
      const std::string problem = control_body_problem(changed);
      if (problem.find(std::string("field '") + field.name + "'") == std::string::npos)
        __builtin_trap();
    }
  }
  json changed = body;
  changed.erase("type");
  if (control_body_problem(changed).empty()) __builtin_trap();
  changed["type"] = type + "?";
  if (control_body_problem(changed).empty()) __builtin_trap();
  if (control_body_problem(json::array({body})).empty()) __builtin_trap();
}

}  // namespace
}  // namespace troupe::actors

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::actors;
  const json body = json::parse(data, data + size, nullptr, false);
  if (body.is_discarded()) return 0;
  const bool passed = control_body_problem(body).empty();
  // The check and the readers agree both ways: nothing unreadable passes, nothing readable is
  // refused.
  if (passed != must_pass(body)) __builtin_trap();
  if (!passed) return 0;
  // An uncaught exception from here on aborts: the check let through what a handler can't read.
  const auto fields = control_fields(body["type"].get<std::string>());
  if (!fields) __builtin_trap();
  for (const control_field& field : *fields) read_as_handlers_do(body, field.name, field.kind);
  check_rejections(body);
  return 0;
}
