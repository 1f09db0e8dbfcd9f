#pragma once

// `troupe train`'s two ways to run a job's pipeline: its stage actors in this process, or in
// worker processes (started here, or joining a coordinator's address); each writes trace.json
// when the job asks for it and returns what the run reported.

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "actors/cluster/cluster_host.h"
#include "actors/config/job_data.h"
#include "actors/engine/run_reports.h"
#include "actors/hosts/pipeline_host.h"
#include "apps/cli/commands.h"

namespace troupe::apps {

/// What a run reported: its summary, and its stages and processes as summary.json holds them.
struct run_outcome {
  actors::training_summary summary;
  nlohmann::json stages;
  nlohmann::json processes;
  bool stopped = false;  ///< stopped early after a checkpoint (SIGTERM)
};

/// Trains through the stage and coordinator actors; writes trace.json when asked.
std::optional<run_outcome> train_pipelined(const actors::job_config& config,
                                           const actors::job_data& data, const std::string& out,
                                           actors::pipeline_options options,
                                           actors::training_observer& observer, std::string* error);

/// Trains with the stages in worker processes: local ones started here, or ones that join
/// `options.listen` presenting `job_file_hash` (the job file's config hash: `troupe launch`
/// ranks do not see the partition chosen here). A worker that dies ends the run with a message
/// naming it.
std::optional<run_outcome> train_cluster(const actors::job_config& config,
                                         const actors::job_data& data, const train_options& options,
                                         const std::string& job_file_hash, const std::string& out,
                                         actors::pipeline_options pipeline,
                                         actors::training_observer& observer, std::string* error);

}  // namespace troupe::apps
