#include "actors/cluster/worker_reports.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "actors/cluster/cluster_control.h"

namespace troupe::actors {

void worker_reports::keep_report(const worker_peer& worker, const nlohmann::json& body,
                                 const transport::message& message) {
  const int64_t stage = body.value("stage", int64_t{-1});
  if (std::find(worker.stages.begin(), worker.stages.end(), stage) == worker.stages.end()) {
    std::fprintf(stderr,
                 "troupe: dropped a report for stage %lld from %s, which does not host it\n",
                 static_cast<long long>(stage), worker.describe().c_str());
    return;
  }
  reports_[static_cast<int>(stage)] = report_from(body, message);
  auto count = message.header.metrics.find("dropped");
  if (count != message.header.metrics.end() && count->second >= 0)
    dropped_ += static_cast<uint64_t>(count->second);
}

void worker_reports::keep_usage(const nlohmann::json& body) {
  process_usage usage = process_usage_from_json(body);
  usage.role = "worker";
  usage_[body.value("address", std::string())] = std::move(usage);
}

void worker_reports::move_into(pipeline_report* report) {
  for (auto& [stage, stage_result] : reports_) report->stages.push_back(std::move(stage_result));
  report->dropped_frames += dropped_;
  for (auto& [address, usage] : usage_) report->processes.push_back(std::move(usage));
  reports_.clear();
  usage_.clear();
  dropped_ = 0;
}

}  // namespace troupe::actors
