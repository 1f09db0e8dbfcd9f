#include "actors/cluster/worker_traces.h"

#include <cstdio>

#include "actors/config/json_text.h"
#include "actors/hosts/wire_format.h"

namespace troupe::actors {

using nlohmann::json;

void worker_traces::keep(const json& body, const transport::message& message, int stages) {
  worker_trace trace;
  trace.address = body.value("address", std::string("?"));
  const json offset = body.value("clock_offset_s", json());
  trace.clock_offset_s = offset.is_number() ? offset.get<double>() : 0.0;
  std::string error;
  auto bytes = state_from_wire(message, &error);
  // A full trace (trace_recorder::default_capacity records) is some 100 MB of JSON: anything
  // far larger is not one, and parsing it would take several times its size in memory.
  constexpr size_t max_trace_bytes = size_t{512} << 20;
  if (bytes && bytes->size() > max_trace_bytes) {
    error = std::to_string(bytes->size()) + " bytes; a trace has at most " +
            std::to_string(max_trace_bytes);
  } else if (bytes) {
    std::optional<json> records = parse_json_text(*bytes, &error, json_limits{16, max_trace_bytes});
    if (records) trace.records = std::move(*records);
  }
  const json listed = body.value("stages", json());
  if (error.empty() && listed.is_array()) {
    for (const json& stage : listed) {
      if (stage.is_number_integer() && stage.get<int>() >= 0 && stage.get<int>() < stages) {
        trace.stages.push_back(stage.get<int>());
      }
    }
  }
  if (!error.empty()) {
    std::fprintf(stderr, "troupe: left the trace of the worker at %s out of trace.json: %s\n",
                 trace.address.c_str(), error.c_str());
    return;
  }
  traces_.push_back(std::move(trace));
}

void worker_traces::merge_into(trace_recorder& run, int stages) const {
  std::vector<double> offsets(static_cast<size_t>(stages) + 1, 0.0);  // by track + 1
  for (const worker_trace& trace : traces_) {
    for (int stage : trace.stages) offsets[stage + 1] = trace.clock_offset_s;
  }
  for (const worker_trace& trace : traces_) {
    std::string error;
    if (!run.add_records(trace.records, offsets, &error)) {
      std::fprintf(stderr, "troupe: left the trace of the worker at %s out of trace.json: %s\n",
                   trace.address.c_str(), error.c_str());
    }
  }
}

}  // namespace troupe::actors
