#pragma once

// `troupe train` in a process of its own: the way validate and the benchmarks measure a run as a
// user starts it, with nothing of the measuring process in its heap or its threads.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::apps {

/// Runs this binary as `troupe train JOB --out OUT --quiet [--set S ...] [--workers N]`
/// (`workers` 0: in one process), its standard output and error in OUT/train.log, waits for
/// it, and returns its OUT/summary.json. Nothing when it could not start, did not exit with
/// status 0 or left no readable summary.
std::optional<nlohmann::json> train_in_child_process(const std::string& job_file,
                                                     const std::vector<std::string>& overrides,
                                                     int workers, const std::string& out);

}  // namespace troupe::apps
