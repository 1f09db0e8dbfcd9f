#pragma once

// The shape of the control protocol's messages: each type a coordinator and its workers send
// (hello, assign, refuse, ready, heartbeat, reset, finish, report, trace, usage) and the kind
// of each field it carries. Every control message read from a peer is checked against it
// before any of its fields is read, so a wrong kind never reaches json::value(), which would
// throw. Plain JSON: no sockets, no CAF (the control fuzzer compiles it alone).

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::actors {

/// The kinds a field may have (rule_of() in control_schema.cpp follows this order).
enum class control_field_kind {
  string,
  integer,           ///< any JSON integer
  unsigned_integer,  ///< a JSON integer >= 0
  number,
  object,
  integers,  ///< an array of integers
  strings,   ///< an array of strings
  array,
};

struct control_field {
  const char* name;
  control_field_kind kind;
};

/// The fields a control message of `type` may carry, those every type may carry (address, pid,
/// clock stamps) first; nothing for a type the protocol does not have.
std::optional<std::vector<control_field>> control_fields(const std::string& type);

/// Why `body` is not a well-formed control message: not an object, no "type" string, a type
/// the protocol does not have, or a field of the wrong kind (a string where a number belongs,
/// an array of anything but integers for stage indices...); "" when it is one. Fields a type
/// does not name are allowed, and missing ones are left to the handler's defaults, so what
/// passes can be read with json::value() without an exception.
std::string control_body_problem(const nlohmann::json& body);

}  // namespace troupe::actors
