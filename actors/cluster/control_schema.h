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

/// The kinds a field may have (rule_of() in control_schema.cpp follows this order). An integer
/// kind holds exactly the values of the C++ type its handlers read it into, so that no value
/// that passes wraps around there.
enum class control_field_kind {
  string,
  index,       ///< an integer from 0 to INT_MAX, read as int: a stage, a protocol version
  natural,     ///< an integer from 0 to INT64_MAX, read as int64_t: steps, counts, bytes, a pid
  identifier,  ///< an integer from 0 to UINT64_MAX, read as uint64_t: a job id
  number,
  object,
  indices,   ///< an array of indexes
  naturals,  ///< an array of naturals
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
/// an array of anything but integers for stage indices, an integer its C++ type cannot hold
/// such as a stage of 2^40 or a negative count...), with the value; "" when it is one. Fields a
/// type does not name are allowed, and missing ones are left to the handler's defaults, so what
/// passes can be read with json::value() without an exception.
std::string control_body_problem(const nlohmann::json& body);

}  // namespace troupe::actors
