#pragma once

// The coordinator's collection of its workers' traces: each worker sends its stages' spans on
// its own clock at the end of a run, with its clock's offset from the coordinator's; once every
// trace is in, they join the run's trace moved onto the coordinator's clock.

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/engine/trace_recorder.h"
#include "transport/codec.h"

namespace troupe::actors {

class worker_traces {
 public:
  /// Keeps the trace that `message` (a "trace" control message, `body` its JSON) carries from
  /// a worker of a run of `stages` stage actors; one that does not parse, or is far larger than
  /// any trace, is left out with a line on stderr naming the worker.
  void keep(const nlohmann::json& body, const transport::message& message, int stages);

  /// Adds every kept trace to `run`, each moved onto the coordinator's clock by the offset of
  /// the worker that read it (a message arrow starts on its sender's clock).
  void merge_into(trace_recorder& run, int stages) const;

 private:
  struct worker_trace {
    std::string address;  ///< of the worker that sent it
    std::vector<int> stages;
    double clock_offset_s = 0;  ///< the coordinator's clock minus the worker's
    nlohmann::json records;     ///< trace_recorder::records() of the worker
  };

  std::vector<worker_trace> traces_;
};

}  // namespace troupe::actors
