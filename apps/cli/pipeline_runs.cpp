#include "apps/cli/pipeline_runs.h"

#include <cstdio>

#include "actors/config/job_file.h"
#include "actors/engine/graph_program.h"
#include "actors/engine/partition.h"
#include "actors/engine/stage_settings.h"
#include "actors/hosts/replica_groups.h"
#include "apps/cli/commands.h"
#include "apps/cli/launch_environment.h"
#include "apps/cli/local_workers.h"
#include "apps/cli/progress.h"
#include "apps/cli/run_output.h"

namespace troupe::apps {
namespace {

/// A graph's node names stage by stage, in the order rows visit them; empty for a chain.
std::vector<std::vector<std::string>> nodes_by_stage(const actors::job_config& config) {
  std::vector<std::vector<std::string>> result;
  if (config.model.nodes.empty()) return result;
  std::string error;
  const auto graph = actors::ordered_graph_of(config, &error);
  const auto ranges = graph ? actors::partition_model(config, &error) : std::nullopt;
  if (!ranges) return result;
  for (const actors::stage_range& range : *ranges) {
    std::vector<std::string>& names = result.emplace_back();
    for (size_t n = range.first; n < range.last && n < graph->nodes.size(); ++n)
      names.push_back(graph->nodes[n].name);
  }
  return result;
}

/// One entry per stage actor; with replicas, replica by replica, each naming its stage and
/// replica; a graph's stages name their nodes (whose weights, all on that stage, share its
/// versions: a node's staleness is its stage's).
nlohmann::json stages_json(const actors::pipeline_report& report,
                           const actors::job_config& config) {
  nlohmann::json stages = nlohmann::json::array();
  const std::vector<std::vector<std::string>> nodes = nodes_by_stage(config);
  for (size_t i = 0; i < report.stages.size(); ++i) {
    const actors::stage_report& stage = report.stages[i];
    nlohmann::json entry = {
        {"mean_staleness", actors::mean_staleness(stage.staleness_histogram).value_or(0.0)},
        {"staleness_histogram", stage.staleness_histogram},
        {"weight_staleness_histogram", stage.weight_staleness_histogram},
        {"peak_contexts", stage.peak_contexts},
        {"peak_activation_bytes", stage.peak_activation_bytes},
        {"optimizer_steps", stage.version}};
    const size_t stage_index =
        static_cast<size_t>(actors::stage_of_actor(config, static_cast<int>(i)));
    if (stage_index < nodes.size()) entry["nodes"] = nodes[stage_index];
    if (config.parallelism.replicas > 1) {
      entry["stage"] = actors::stage_of_actor(config, static_cast<int>(i));
      entry["replica"] = actors::replica_of_actor(config, static_cast<int>(i));
      if (config.parallelism.mode == actors::pipeline_mode::async) {
        entry["replica_staleness_histogram"] = stage.replica_staleness_histogram;
      }
    }
    stages.push_back(std::move(entry));
  }
  return stages;
}

nlohmann::json processes_json(const actors::pipeline_report& report) {
  nlohmann::json processes = nlohmann::json::array();
  for (const auto& process : report.processes) processes.push_back(actors::to_json(process));
  return processes;
}

/// Writes the run's trace.json, and says so when it is missing spans for want of room.
bool write_trace(const actors::trace_recorder& trace, const std::string& out, std::string* error) {
  if (!write_trace_file(trace, out + "/trace.json", error)) return false;
  if (const uint64_t dropped = trace.dropped()) {
    std::fprintf(stderr,
                 "troupe: trace.json holds the first %zu spans and messages; %llu more were left "
                 "out\n",
                 trace.capacity(), static_cast<unsigned long long>(dropped));
  }
  return true;
}

}  // namespace

std::optional<run_outcome> train_pipelined(const actors::job_config& config,
                                           const actors::job_data& data, const std::string& out,
                                           actors::pipeline_options options,
                                           actors::training_observer& observer,
                                           std::string* error) {
  steady_clock_source clock;
  actors::trace_recorder trace(actors::stage_actor_count(config));
  if (config.metrics.trace) options.trace = &trace;
  auto report = actors::run_pipeline(config, data, observer, clock, options, error);
  if (!report) return std::nullopt;
  if (config.metrics.trace && !write_trace(trace, out, error)) return std::nullopt;
  if (report->dropped_frames > 0) {
    std::fprintf(stderr, "troupe: %llu undecodable frames were dropped\n",
                 static_cast<unsigned long long>(report->dropped_frames));
  }
  return run_outcome{report->summary, stages_json(*report, config), processes_json(*report),
                     report->stopped};
}

std::optional<run_outcome> train_cluster(const actors::job_config& config,
                                         const actors::job_data& data, const train_options& options,
                                         const std::string& job_file_hash, const std::string& out,
                                         actors::pipeline_options pipeline,
                                         actors::training_observer& observer, std::string* error) {
  steady_clock_source clock;
  actors::coordinator_options cluster;
  cluster.workers = options.workers;
  std::string unread;  // the job file was read a moment ago
  cluster.job_toml = read_text_file(options.job_file, &unread).value_or("");
  cluster.overrides = options.overrides;
  cluster.job_hash = job_file_hash;
  cluster.liveness.timeout_s = options.heartbeat_timeout_s;
  auto security = security_from(options.keys_directory, options.key_name, options.insecure, error);
  if (!security) return std::nullopt;
  cluster.security = *security;
  actors::trace_recorder trace(actors::stage_actor_count(config));
  cluster.pipeline = std::move(pipeline);
  if (config.metrics.trace) cluster.pipeline.trace = &trace;
  std::optional<local_workers> local;
  if (options.listen.empty()) {
    local.emplace();
    cluster.listen_address = local->coordinator_address();
    cluster.run_secret = local->run_secret();
    if (!local->start(options.workers, error)) return std::nullopt;
    cluster.replace_worker = [&local](std::string* problem) {
      return local->start_replacement(problem);
    };
    cluster.exited_workers = [&local] { return local->collect_exited(); };
  } else {
    cluster.listen_address = options.listen;
    cluster.run_secret = run_secret_from_environment();
  }
  auto report = actors::run_coordinator(config, data, cluster, observer, clock, error);
  if (!report) return std::nullopt;
  if (config.metrics.trace && !write_trace(trace, out, error)) return std::nullopt;
  return run_outcome{report->summary, stages_json(*report, config), processes_json(*report),
                     report->stopped};
}

}  // namespace troupe::apps
