// The control protocol's message shapes: what the coordinator and workers send passes, and a
// field of the wrong kind, an unknown type or a body that is no object is named.

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "actors/cluster/control_schema.h"
#include "actors/hosts/pipeline_host.h"

namespace troupe::actors {
namespace {

using json = nlohmann::json;

TEST(ControlSchemaTest, TheMessagesTheProtocolSendsPass) {
  process_usage usage;
  usage.role = "worker";
  usage.host = "node3";
  usage.stages = {1, 2};
  json usage_body = to_json(usage);
  usage_body["type"] = "usage";
  const std::vector<json> bodies = {
      {{"type", "hello"},
       {"protocol", 3},
       {"job_hash", "c2e2"},
       {"host", "node3"},
       {"public_key", ""},
       {"address", "tcp://10.0.0.3:4000"},
       {"pid", 42},
       {"clock_s", 1.5}},
      {{"type", "assign"},
       {"job_toml", "[model]"},
       {"overrides", {"training.lr=0.1"}},
       {"stages", {0, 1}},
       {"addresses", {"a", "b"}},
       {"keys", {"", ""}},
       {"coordinator", "c"},
       {"coordinator_key", ""},
       {"job_id", uint64_t{1} << 63},
       {"steps_per_epoch", 10},
       {"total_steps", 20},
       {"echo", {{"sent_s", 1.0}, {"received_s", 1.1}}},
       {"sent_s", 1.2}},
      {{"type", "ready"}, {"stages", {0, 1}}, {"job_id", 7u}},
      {{"type", "report"},
       {"stage", 1},
       {"version", 12},
       {"peak_contexts", 3u},
       {"staleness", {5, 0, 1}},
       {"weight_staleness", {6}}},
      {{"type", "trace"}, {"stages", {2}}, {"clock_offset_s", -0.25}},
      usage_body,
      {{"type", "heartbeat"}},
      {{"type", "refuse"}, {"reason", "the job already has its 2 workers"}},
      {{"type", "reset"}, {"job_id", 9u}},
      {{"type", "finish"}, {"job_id", 9u}},
      {{"type", "hello"}, {"unknown_field", {1, 2}}},  // fields a type does not name are allowed
  };
  for (const json& body : bodies) EXPECT_EQ(control_body_problem(body), "") << body.dump();
}

TEST(ControlSchemaTest, WrongShapesAreNamed) {
  const std::vector<std::pair<json, std::string>> cases = {
      {json::array({1, 2}), "not a JSON object but array"},
      {json("hello"), "not a JSON object but string"},
      {{{"kind", "hello"}}, "no \"type\" string"},
      {{{"type", 7}}, "no \"type\" string"},
      {{{"type", "frobnicate"}}, "unknown type 'frobnicate'"},
      {{{"type", "hello"}, {"host", 42}},
       "a hello message whose field 'host' must be a string, got 42"},
      {{{"type", "hello"}, {"address", json::array()}},
       "a hello message whose field 'address' must be a string, got array"},
      {{{"type", "ready"}, {"job_id", -1}},
       "a ready message whose field 'job_id' must be an integer from 0 to "
       "18446744073709551615, got -1"},
      {{{"type", "report"}, {"stage", 1.5}},
       "a report message whose field 'stage' must be an integer from 0 to 2147483647, got 1.5"},
      {{{"type", "report"}, {"staleness", {1, "x"}}},
       "a report message whose field 'staleness' must be an array of integers from 0 to "
       "9223372036854775807, got string at [1]"},
      {{{"type", "assign"}, {"overrides", {{{"a", 1}}}}},
       "a assign message whose field 'overrides' must be an array of strings"},
      {{{"type", "heartbeat"}, {"echo", 5}},
       "a heartbeat message whose field 'echo' must be an object"},
      {{{"type", "usage"}, {"user_s", "lots"}},
       "a usage message whose field 'user_s' must be a number"},
  };
  for (const auto& [body, expected] : cases) {
    EXPECT_NE(control_body_problem(body).find(expected), std::string::npos)
        << body.dump() << " -> " << control_body_problem(body);
  }
}

TEST(ControlSchemaTest, IntegersTheirTypeCannotHoldAreRejectedNotWrapped) {
  // Each integer field holds exactly what the C++ type its handler reads it into holds: a
  // stage as int, steps and counts as int64_t, a job id as uint64_t.
  const json two_to_the_70 = json::parse("1180591620717411303424");
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"type", "report"}, {"stage", int64_t{1} << 40}},
       "field 'stage' must be an integer from 0 to 2147483647, got 1099511627776"},
      {{{"type", "report"}, {"stage", -1}}, "field 'stage' must be an integer from 0"},
      {{{"type", "ready"}, {"stages", {0, int64_t{1} << 31}}},
       "field 'stages' must be an array of integers from 0 to 2147483647, got 2147483648 at [1]"},
      {{{"type", "assign"}, {"total_steps", two_to_the_70}},
       "field 'total_steps' must be an integer from 0 to 9223372036854775807, got 1.1805916207"},
      {{{"type", "assign"}, {"steps_per_epoch", -5}},
       "field 'steps_per_epoch' must be an integer from 0 to 9223372036854775807, got -5"},
      {{{"type", "report"}, {"peak_contexts", -2}}, "field 'peak_contexts' must be an integer"},
      {{{"type", "report"}, {"weight_staleness", {3, -1}}},
       "field 'weight_staleness' must be an array of integers from 0 to 9223372036854775807, "
       "got -1 at [1]"},
      {{{"type", "hello"}, {"pid", uint64_t{1} << 63}},
       "field 'pid' must be an integer from 0 to 9223372036854775807, got 9223372036854775808"},
      {{{"type", "hello"}, {"protocol", int64_t{1} << 32}}, "field 'protocol' must be an integer"},
      {{{"type", "finish"}, {"job_id", two_to_the_70}},
       "field 'job_id' must be an integer from 0 to 18446744073709551615, got 1.18059162"},
  };
  for (const auto& [body, expected] : cases) {
    EXPECT_NE(control_body_problem(body).find(expected), std::string::npos)
        << body.dump() << " -> " << control_body_problem(body);
  }
  // The largest value of each type passes.
  const std::vector<json> largest = {
      {{"type", "report"}, {"stage", 2147483647}, {"version", INT64_MAX}},
      {{"type", "assign"}, {"stages", {0, 2147483647}}, {"total_steps", INT64_MAX}},
      {{"type", "finish"}, {"job_id", UINT64_MAX}},
  };
  for (const json& body : largest) EXPECT_EQ(control_body_problem(body), "") << body.dump();
}

TEST(ControlSchemaTest, EveryTypeHasTheCommonFieldsFirst) {
  for (const char* type : {"hello", "assign", "ready", "report", "finish"}) {
    const auto fields = control_fields(type);
    ASSERT_TRUE(fields) << type;
    EXPECT_EQ(std::string(fields->front().name), "address") << type;
  }
  EXPECT_FALSE(control_fields("frobnicate"));
}

}  // namespace
}  // namespace troupe::actors
