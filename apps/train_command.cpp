#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "actors/cluster/cluster_host.h"
#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/config/job_warnings.h"
#include "actors/config/layer_cuts.h"
#include "actors/engine/memory_estimate.h"
#include "actors/engine/partition.h"
#include "actors/engine/sequential_trainer.h"
#include "actors/engine/stage_settings.h"
#include "actors/engine/stage_state.h"
#include "actors/engine/training_loop.h"
#include "actors/hosts/pipeline_host.h"
#include "actors/hosts/replica_groups.h"
#include "actors/storage/model_weights.h"
#include "actors/storage/safetensors.h"
#include "apps/commands.h"
#include "apps/dashboard_server.h"
#include "apps/launch_environment.h"
#include "apps/local_workers.h"
#include "apps/machine_memory.h"
#include "apps/partition_choice.h"
#include "apps/progress.h"
#include "apps/run_output.h"
#include "apps/run_signals.h"
#include "layers/backend_registry.h"

namespace troupe::apps {
namespace {

int bad_input(const std::string& message) {
  std::fprintf(stderr, "troupe: %s\n", message.c_str());
  return 2;
}

std::string default_out_directory(const std::string& job_file) {
  return "runs/" + std::filesystem::path(job_file).stem().string();
}

int classes_of(const actors::job_config& config) {
  return config.data.dataset == actors::dataset_kind::synthetic ? config.data.classes : 10;
}

/// One entry per stage actor; with replicas, replica by replica, each naming its stage and
/// replica.
nlohmann::json stages_json(const actors::pipeline_report& report,
                           const actors::job_config& config) {
  nlohmann::json stages = nlohmann::json::array();
  for (size_t i = 0; i < report.stages.size(); ++i) {
    const actors::stage_report& stage = report.stages[i];
    nlohmann::json entry = {{"staleness_histogram", stage.staleness_histogram},
                            {"weight_staleness_histogram", stage.weight_staleness_histogram},
                            {"peak_contexts", stage.peak_contexts},
                            {"peak_activation_bytes", stage.peak_activation_bytes},
                            {"optimizer_steps", stage.version}};
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

struct run_outcome {
  actors::training_summary summary;
  nlohmann::json stages;
  nlohmann::json processes;
  bool stopped = false;  ///< stopped early after a checkpoint (SIGTERM)
};

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

/// Trains through the stage and coordinator actors; writes trace.json when asked.
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

/// Trains with the stages in worker processes: local ones started here, or ones that join
/// `options.listen` presenting `job_file_hash` (the job file's config hash: `troupe launch`
/// ranks do not see the partition chosen here). A worker that dies ends the run with a message
/// naming it.
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
    if (!local->start(options.workers, error)) return std::nullopt;
    cluster.replace_worker = [&local](std::string* problem) {
      return local->start_replacement(problem);
    };
    cluster.exited_workers = [&local] { return local->collect_exited(); };
  } else {
    cluster.listen_address = options.listen;
  }
  auto report = actors::run_coordinator(config, data, cluster, observer, clock, error);
  if (!report) return std::nullopt;
  if (config.metrics.trace && !write_trace(trace, out, error)) return std::nullopt;
  return run_outcome{report->summary, stages_json(*report, config), processes_json(*report),
                     report->stopped};
}

/// The checkpoint to continue from for --resume; nothing, with `error` set, when none loads.
std::optional<actors::loaded_checkpoint> checkpoint_to_resume(const actors::job_config& config,
                                                              const train_options& options,
                                                              const std::string& checkpoints,
                                                              std::string* error) {
  const std::string path = options.resume_path.empty() ? checkpoints : options.resume_path;
  std::vector<std::string> problems;
  auto checkpoint =
      actors::resolve_resume(path, actors::checkpoint_config_hash(config), &problems, error);
  for (const std::string& problem : problems) {
    std::fprintf(stderr, "troupe: skipped a checkpoint: %s\n", problem.c_str());
  }
  if (checkpoint) {
    std::fprintf(stderr, "troupe: resuming from %s (step %lld, epoch %lld)\n",
                 checkpoint->directory.c_str(), static_cast<long long>(checkpoint->manifest.step),
                 static_cast<long long>(checkpoint->manifest.epoch));
  }
  return checkpoint;
}

/// The run's checkpoint, resume and initial-weight settings; nothing with `error` set when the
/// resume point or the initial weights cannot be had.
std::optional<actors::pipeline_options> run_settings(const actors::job_config& config,
                                                     const train_options& options,
                                                     const std::string& out, std::string* error) {
  actors::pipeline_options pipeline;
  pipeline.checkpoint_directory =
      config.checkpoint.dir.empty() ? out + "/checkpoints" : config.checkpoint.dir;
  pipeline.job_name = std::filesystem::path(options.job_file).stem().string();
  if (options.resume) {
    pipeline.resume = checkpoint_to_resume(config, options, pipeline.checkpoint_directory, error);
    if (!pipeline.resume) return std::nullopt;
  } else if (!config.model.init_from.empty()) {
    auto states = actors::initial_stage_states(config, error);
    if (!states) return std::nullopt;
    for (const actors::stage_state& state : *states) {
      pipeline.initial_weights.push_back(
          std::make_shared<const std::string>(actors::serialize_stage_state(state)));
    }
  }
  return pipeline;
}

/// The run's fixed facts, for the dashboard's summary.
nlohmann::json monitor_info(const actors::job_config& config, const train_options& options,
                            const actors::job_data& data) {
  return {{"job", std::filesystem::path(options.job_file).stem().string()},
          {"source", "live"},
          {"mode", config.parallelism.mode},
          {"schedule", config.parallelism.schedule},
          {"stages", config.parallelism.stages},
          {"replicas", config.parallelism.replicas},
          {"epochs", config.training.epochs},
          {"total_steps", actors::planned_steps(config, data.train.count())},
          {"pid", static_cast<int64_t>(::getpid())}};
}

/// The job's warnings (actors/config/job_warnings.h), once, by the process that runs the job:
/// the recovery one only when its stages run in worker processes, the one case where a lost
/// worker is recovered from.
void print_warnings(const actors::job_config& config, const train_options& options,
                    const std::vector<std::string>& warnings) {
  for (const std::string& warning : warnings) {
    std::fprintf(stderr, "troupe: warning: %s\n", warning.c_str());
  }
  if (options.workers == 0) return;
  if (const std::optional<std::string> warning = actors::recovery_warning(config)) {
    std::fprintf(stderr, "troupe: warning: %s: %s\n", options.job_file.c_str(), warning->c_str());
  }
}

}  // namespace

int run_worker_command(const worker_command_options& options) {
  steady_clock_source clock;
  actors::worker_options worker;
  worker.coordinator_address = options.coordinator;
  worker.listen_address = options.listen;
  worker.liveness.timeout_s = options.heartbeat_timeout_s;
  worker.job_hash = options.job_hash;
  worker.stop_requests = install_worker_signals();
  std::string error;
  auto security = security_from(options.keys_directory, options.key_name, options.insecure, &error);
  if (!security) {
    std::fprintf(stderr, "troupe worker: %s\n", error.c_str());
    return 2;
  }
  worker.security = *security;
  if (security->curve) {
    auto key = public_key_named(options.keys_directory, options.coordinator_key_name, &error);
    if (!key) {
      std::fprintf(stderr, "troupe worker: %s\n", error.c_str());
      return 2;
    }
    worker.coordinator_key = *key;
  }
  const int status = actors::run_worker(worker, clock, &error);
  if (status != 0) std::fprintf(stderr, "troupe worker: %s\n", error.c_str());
  return status;
}

int run_train(const train_options& given) {
  actors::job_error job_problem;
  std::vector<std::string> warnings;
  auto config = actors::load_job_file(given.job_file, given.overrides, &job_problem, &warnings);
  if (!config) return bad_input(job_problem.message);
  std::string error;
  if (!actors::check_model(*config, classes_of(*config), &error) ||
      !actors::partition_model(*config, &error)) {
    return bad_input(given.job_file + ": " + error);
  }
  // Before the first allocation: the stages run on this machine unless workers join from
  // elsewhere (a coordinator that listens).
  if (given.listen.empty() && !actors::check_memory(*config, available_memory_bytes(), &error)) {
    return bad_input(given.job_file + ": " + error);
  }
  const int stage_actors = actors::stage_actor_count(*config);
  if (given.workers > 0 && config->parallelism.replicas > 1 && stage_actors % given.workers != 0) {
    return bad_input(given.job_file + ": " + std::to_string(given.workers) +
                     " workers do not divide parallelism.replicas (" +
                     std::to_string(config->parallelism.replicas) + ") x parallelism.stages (" +
                     std::to_string(config->parallelism.stages) +
                     ") = " + std::to_string(stage_actors) + " stages: every worker hosts as many");
  }
  const std::string group_problem = actors::replica_group_problem(*config, given.workers == 0);
  if (!group_problem.empty()) return bad_input(given.job_file + ": " + group_problem);
  if (given.workers > stage_actors) {
    return bad_input(given.job_file + ": " + std::to_string(given.workers) + " workers for " +
                     std::to_string(stage_actors) + " stages: every worker must host one at least");
  }
  const std::string out =
      given.out_directory.empty() ? default_out_directory(given.job_file) : given.out_directory;
  // Chosen once, here: the workers read the job with the chosen cut points added.
  train_options options = given;
  const std::string partition = config->parallelism.partition;
  const std::string job_file_hash = actors::job_identity_hash(*config);
  auto partition_line =
      choose_partition(&*config, options.resume ? out + "/config.json" : "", &error);
  if (!partition_line) return bad_input(options.job_file + ": " + error);
  if (config->parallelism.partition != partition) {
    // As the job file spells it: "4:736" cuts inside block 4 (actors/config/layer_cuts.h).
    const std::string cuts = actors::written_job(*config).parallelism.partition;
    options.overrides.push_back("parallelism.partition=\"" + cuts + "\"");
  }
  auto data = actors::load_job_data(*config, &error);
  if (!data) return bad_input(error);
  if (data->train.count() < config->training.batch_size) {
    return bad_input(options.job_file + ": training.batch_size = " +
                     std::to_string(config->training.batch_size) + " is larger than the " +
                     std::to_string(data->train.count()) + " training samples");
  }
  auto device = layers::create_backend(config->parallelism.devices.front(),
                                       config->parallelism.threads, &error);
  if (!device) return bad_input("parallelism.devices: " + error);

  if (!make_directory(out, &error) ||
      !write_json_file(out + "/config.json", actors::to_json(*config), &error)) {
    return bad_input(error);
  }
  auto pipeline = run_settings(*config, options, out, &error);
  if (!pipeline) return bad_input(error);
  pipeline->checkpoint_requests = install_run_signals();
  pipeline->status_requests = status_requests();
  steady_clock_source monitor_clock;
  // The stall watch and the dashboard read the run's monitor; without either there is none.
  std::shared_ptr<actors::run_monitor> monitor;
  if (options.dashboard || config->metrics.stall_timeout_s > 0) {
    monitor = std::make_shared<actors::run_monitor>(monitor_info(*config, options, *data),
                                                    actors::stage_actor_count(*config),
                                                    monitor_clock.now_seconds());
  }
  pipeline->monitor = monitor.get();
  std::optional<dashboard_server> dashboard;
  if (options.dashboard) {
    auto address =
        parse_dashboard_address(options.dashboard_address, options.dashboard_token, &error);
    if (!address) return bad_input(error);
    dashboard.emplace(
        [monitor, &monitor_clock] {
          return dashboard_view{monitor, monitor_clock.now_seconds()};
        },
        options.dashboard_token);
    if (!dashboard->start(*address, &error)) return bad_input(error);
    std::fprintf(stderr, "troupe: dashboard at http://%s:%d/%s\n", address->host.c_str(),
                 dashboard->port(),
                 options.dashboard_token.empty() ? "" : "?token=<--dashboard-token>");
  }
  metrics_log log(out + "/metrics.jsonl", options.resume);
  if (!log.ok()) return bad_input("cannot write " + out + "/metrics.jsonl");

  const int64_t per_epoch = data->train.count() / config->training.batch_size;
  std::fprintf(
      stderr, "troupe: training %s on %s: %d stage(s), %s mode, %lld steps, output in %s\n",
      options.job_file.c_str(), device->name().c_str(), config->parallelism.stages,
      to_string(config->parallelism.mode),
      static_cast<long long>(actors::planned_steps(*config, data->train.count())), out.c_str());
  if (const std::string note = interleaving_note(*config); !note.empty()) {
    std::fprintf(stderr, "%s\n", note.c_str());
  }
  print_warnings(*config, options, warnings);
  std::printf("%s\n", partition_line->c_str());
  std::fflush(stdout);
  if (const std::string hint = layer_cut_hint(*config); !hint.empty()) {
    std::fprintf(stderr, "%s\n", hint.c_str());
  }
  const bool interactive = !options.quiet && config->metrics.progress && isatty(STDERR_FILENO);
  run_reporter reporter(&log, stderr, interactive, per_epoch, config->training.epochs);
  reporter.show_on(monitor.get());
  run_outcome outcome;
  if (options.workers > 0) {
    auto result =
        train_cluster(*config, *data, options, job_file_hash, out, *pipeline, reporter, &error);
    if (!result) {
      std::fprintf(stderr, "troupe: %s\n", error.c_str());
      return 1;
    }
    outcome = std::move(*result);
  } else {
    auto result = train_pipelined(*config, *data, out, *pipeline, reporter, &error);
    if (!result) {
      std::fprintf(stderr, "troupe: %s: %s\n", options.job_file.c_str(), error.c_str());
      return 1;
    }
    outcome = std::move(*result);
  }
  const actors::training_summary& summary = outcome.summary;
  nlohmann::json summary_json = to_json(summary);
  if (!outcome.stages.is_null()) summary_json["stages"] = outcome.stages;
  if (!outcome.processes.is_null()) summary_json["processes"] = outcome.processes;
  summary_json["stopped_early"] = outcome.stopped;
  if (monitor) monitor->set_finished(summary_json);
  if (!write_json_file(out + "/summary.json", summary_json, &error)) {
    std::fprintf(stderr, "troupe: %s\n", error.c_str());
    return 1;
  }
  if (outcome.stopped) {
    std::fprintf(stderr,
                 "troupe: stopped at step %lld after a checkpoint; continue with --resume\n",
                 static_cast<long long>(summary.steps));
  }
  if (outcome.stages.is_array() && !outcome.stages.empty()) {
    std::string memory;
    for (const auto& stage : outcome.stages) {
      char text[32];
      std::snprintf(text, sizeof text, "%s%.1f MB", memory.empty() ? "" : ", ",
                    stage.value("peak_activation_bytes", int64_t{0}) / 1e6);
      memory += text;
    }
    std::printf("peak activation memory per stage: %s%s\n", memory.c_str(),
                config->parallelism.recompute ? " (recompute)" : "");
  }
  // A run stopped before its first evaluation has no figure to give: it says so.
  if (summary.tokens_per_s) {
    char figures[96] = "no evaluation yet";
    if (summary.bits_per_byte) {
      std::snprintf(figures, sizeof figures, "validation_loss %.4f  bits_per_byte %.4f",
                    summary.final_test_loss, *summary.bits_per_byte);
    }
    std::printf("%s  steps %lld  epochs %lld  %.0f tokens/s  %.1f s\n", figures,
                static_cast<long long>(summary.steps), static_cast<long long>(summary.epochs),
                summary.tokens_per_s.value_or(0.0), summary.wall_s);
    return 0;
  }
  char accuracy[64] = "no evaluation yet";
  if (summary.evaluated) {
    std::snprintf(accuracy, sizeof accuracy, "final_test_accuracy %.4f",
                  summary.final_test_accuracy);
  }
  std::printf("%s  steps %lld  epochs %lld  %.0f samples/s  %.1f s\n", accuracy,
              static_cast<long long>(summary.steps), static_cast<long long>(summary.epochs),
              summary.samples_per_s, summary.wall_s);
  return 0;
}

}  // namespace troupe::apps
