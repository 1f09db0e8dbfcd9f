// libFuzzer target for the control protocol's JSON (actors/cluster/control_schema.h): no text may
// crash the parse or the shape check, and whatever the check passes must be readable, field by
// field, the way the coordinator and the workers read it (json::value() with the field's C++ type),
// without an exception. The input is the text of one control message.

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
    case control_field_kind::integer:
      (void)body.value(name, int64_t{0});
      (void)body.value(name, 0);
      break;
    case control_field_kind::unsigned_integer:
      (void)body.value(name, uint64_t{0});
      break;
    case control_field_kind::number:
      (void)body.value(name, 0.0);
      break;
    case control_field_kind::object:
    case control_field_kind::array:
      (void)body.value(name, json());
      break;
    case control_field_kind::integers:
      (void)body.value(name, std::vector<int64_t>{});
      (void)body.value(name, std::vector<int>{});
      break;
    case control_field_kind::strings:
      (void)body.value(name, std::vector<std::string>{});
      break;
  }
}

}  // namespace
}  // namespace troupe::actors

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::actors;
  const json body = json::parse(data, data + size, nullptr, false);
  if (body.is_discarded()) return 0;
  if (!control_body_problem(body).empty()) return 0;
  // An uncaught exception from here on aborts: the check let through what a handler can't read.
  const auto fields = control_fields(body["type"].get<std::string>());
  if (!fields) __builtin_trap();
  for (const control_field& field : *fields) read_as_handlers_do(body, field.name, field.kind);
  return 0;
}
