#pragma once

// What the workers report to the cluster coordinator as a run ends: each stage's final report
// (from the worker that hosts it), the frames their stages dropped, and each worker's CPU time.

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "actors/cluster/worker_peers.h"
#include "actors/hosts/pipeline_host.h"
#include "transport/message.h"

namespace troupe::actors {

class worker_reports {
 public:
  /// Keeps the final report of the stage `body` names when `worker` hosts that stage; drops it,
  /// saying so, otherwise.
  void keep_report(const worker_peer& worker, const nlohmann::json& body,
                   const transport::message& message);

  /// Keeps a worker's account of its CPU time (its last one: a worker sends it at the end).
  void keep_usage(const nlohmann::json& body);

  /// Stages whose final report has come.
  int stages_reported() const { return static_cast<int>(reports_.size()); }

  /// Moves the stages' reports (in stage order) and the workers' usage into `report`, and adds
  /// the frames their stages dropped to its count.
  void move_into(pipeline_report* report);

 private:
  std::map<int, stage_report> reports_;
  std::map<std::string, process_usage> usage_;  ///< by worker address
  uint64_t dropped_ = 0;
};

}  // namespace troupe::actors
