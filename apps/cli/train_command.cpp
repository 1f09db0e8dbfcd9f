// `troupe train JOB`: reads and checks the job, chooses its partition, trains it in this process
// or with worker processes (pipeline_runs.h) while the progress, the metrics log and, when asked,
// the dashboard watch it, and writes config.json, metrics.jsonl and summary.json.

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/config/job_warnings.h"
#include "actors/config/layer_cuts.h"
#include "actors/engine/memory_estimate.h"
#include "actors/engine/partition.h"
#include "actors/engine/run_reports.h"
#include "actors/engine/sequential_trainer.h"
#include "actors/engine/stage_settings.h"
#include "actors/engine/stage_state.h"
#include "actors/hosts/pipeline_host.h"
#include "actors/hosts/replica_groups.h"
#include "actors/storage/checkpoint_recut.h"
#include "actors/storage/model_weights.h"
#include "actors/storage/safetensors.h"
#include "apps/cli/commands.h"
#include "apps/cli/machine_memory.h"
#include "apps/cli/partition_choice.h"
#include "apps/cli/pipeline_runs.h"
#include "apps/cli/progress.h"
#include "apps/cli/run_output.h"
#include "apps/cli/run_signals.h"
#include "apps/dashboard/dashboard_server.h"
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
  if (checkpoint && actors::needs_recut(*checkpoint, config)) {
    std::fprintf(stderr, "troupe: cutting the checkpoint's %d stages into this job's %d\n",
                 checkpoint->manifest.stages, config.parallelism.stages);
    return actors::recut_checkpoint(*checkpoint, config, error);
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

/// A job checked and ready to train: its configuration with the partition chosen, its data,
/// its first device, and where its output goes.
struct training_job {
  train_options options;  ///< as given, the chosen cut points added to the overrides
  actors::job_config config;
  std::vector<std::string> warnings;  ///< the job file's (actors/config/job_warnings.h)
  std::optional<actors::job_data> data;
  std::unique_ptr<layers::backend> device;
  std::string out;
  std::string job_file_hash;  ///< of the job as read, before the partition was chosen
  std::string partition_line;
};

/// Why `workers` worker processes cannot host the job's stages; nothing when they can.
std::optional<std::string> workers_problem(const actors::job_config& config, int workers) {
  const int stage_actors = actors::stage_actor_count(config);
  if (workers > 0 && config.parallelism.replicas > 1 && stage_actors % workers != 0) {
    return std::to_string(workers) + " workers do not divide parallelism.replicas (" +
           std::to_string(config.parallelism.replicas) + ") x parallelism.stages (" +
           std::to_string(config.parallelism.stages) + ") = " + std::to_string(stage_actors) +
           " stages: every worker hosts as many";
  }
  const std::string group_problem = actors::replica_group_problem(config, workers == 0);
  if (!group_problem.empty()) return group_problem;
  if (workers > stage_actors) {
    return std::to_string(workers) + " workers for " + std::to_string(stage_actors) +
           " stages: every worker must host one at least";
  }
  return std::nullopt;
}

/// Chooses the partition once, here: the workers read the job with the chosen cut points
/// added to its overrides. False with `error` set when it cannot be chosen.
bool choose_job_partition(training_job* job, std::string* error) {
  const std::string partition = job->config.parallelism.partition;
  auto line =
      choose_partition(&job->config, job->options.resume ? job->out + "/config.json" : "", error);
  if (!line) return false;
  job->partition_line = *line;
  if (job->config.parallelism.partition != partition) {
    // As the job file spells it: "4:736" cuts inside block 4 (actors/config/layer_cuts.h).
    const std::string cuts = actors::written_job(job->config).parallelism.partition;
    job->options.overrides.push_back("parallelism.partition=\"" + cuts + "\"");
  }
  return true;
}

/// Reads the job's data and opens its first device; 0, or 2 after saying what failed.
int load_data_and_device(training_job* job) {
  std::string error;
  job->data = actors::load_job_data(job->config, &error);
  if (!job->data) return bad_input(error);
  if (job->data->train.count() < job->config.training.batch_size) {
    return bad_input(job->options.job_file + ": training.batch_size = " +
                     std::to_string(job->config.training.batch_size) + " is larger than the " +
                     std::to_string(job->data->train.count()) + " training samples");
  }
  job->device = layers::create_backend(job->config.parallelism.devices.front(),
                                       job->config.parallelism.threads, &error);
  if (!job->device) return bad_input("parallelism.devices: " + error);
  return 0;
}

/// Reads and checks the job as `given`: its model, its stages' hosts, its partition, its data
/// and its device. 0, or 2 after saying what is wrong.
int load_training_job(const train_options& given, training_job* job) {
  actors::job_error job_problem;
  auto config =
      actors::load_job_file(given.job_file, given.overrides, &job_problem, &job->warnings);
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
  if (const auto problem = workers_problem(*config, given.workers)) {
    return bad_input(given.job_file + ": " + *problem);
  }
  job->config = std::move(*config);
  job->options = given;
  job->out =
      given.out_directory.empty() ? default_out_directory(given.job_file) : given.out_directory;
  job->job_file_hash = actors::job_identity_hash(job->config);
  if (!choose_job_partition(job, &error)) return bad_input(given.job_file + ": " + error);
  return load_data_and_device(job);
}

/// What watches a run: its monitor, read by the stall watch and the dashboard (none without
/// either), and the dashboard.
struct run_watch {
  steady_clock_source clock;
  std::shared_ptr<actors::run_monitor> monitor;
  std::optional<dashboard_server> dashboard;
};

/// Starts the run's monitor and dashboard, as far as the job asks for them; false with `error`
/// set when the dashboard cannot start.
bool watch_run(const training_job& job, run_watch* watch, std::string* error) {
  const train_options& options = job.options;
  if (options.dashboard || job.config.metrics.stall_timeout_s > 0) {
    watch->monitor = std::make_shared<actors::run_monitor>(
        monitor_info(job.config, options, *job.data), actors::stage_actor_count(job.config),
        watch->clock.now_seconds());
  }
  if (!options.dashboard) return true;
  auto address = parse_dashboard_address(options.dashboard_address, options.dashboard_token, error);
  if (!address) return false;
  watch->dashboard.emplace(
      [monitor = watch->monitor, clock = &watch->clock] {
        return dashboard_view{monitor, clock->now_seconds()};
      },
      options.dashboard_token);
  if (!watch->dashboard->start(*address, error)) return false;
  std::fprintf(stderr, "troupe: dashboard at http://%s:%d/%s\n", address->host.c_str(),
               watch->dashboard->port(),
               options.dashboard_token.empty() ? "" : "?token=<--dashboard-token>");
  return true;
}

/// Says what is about to train, where, and what the user should know of it.
void announce(const training_job& job) {
  const actors::job_config& config = job.config;
  std::fprintf(stderr,
               "troupe: training %s on %s: %d stage(s), %s mode, %lld steps, output in %s\n",
               job.options.job_file.c_str(), job.device->name().c_str(), config.parallelism.stages,
               to_string(config.parallelism.mode),
               static_cast<long long>(actors::planned_steps(config, job.data->train.count())),
               job.out.c_str());
  if (const std::string note = interleaving_note(config); !note.empty()) {
    std::fprintf(stderr, "%s\n", note.c_str());
  }
  print_warnings(config, job.options, job.warnings);
  std::printf("%s\n", job.partition_line.c_str());
  std::fflush(stdout);
  if (const std::string hint = layer_cut_hint(config); !hint.empty()) {
    std::fprintf(stderr, "%s\n", hint.c_str());
  }
}

/// Trains with the stages in worker processes or in this one; nothing after saying why it
/// failed.
std::optional<run_outcome> train_job(const training_job& job,
                                     const actors::pipeline_options& pipeline,
                                     actors::training_observer& observer) {
  std::string error;
  if (job.options.workers > 0) {
    auto result = train_cluster(job.config, *job.data, job.options, job.job_file_hash, job.out,
                                pipeline, observer, &error);
    if (!result) std::fprintf(stderr, "troupe: %s\n", error.c_str());
    return result;
  }
  auto result = train_pipelined(job.config, *job.data, job.out, pipeline, observer, &error);
  if (!result) {
    std::fprintf(stderr, "troupe: %s: %s\n", job.options.job_file.c_str(), error.c_str());
  }
  return result;
}

/// The run's summary.json: the summary, its stages and processes, and whether it stopped early.
nlohmann::json summary_json_of(const run_outcome& outcome) {
  nlohmann::json summary = to_json(outcome.summary);
  if (!outcome.stages.is_null()) summary["stages"] = outcome.stages;
  if (!outcome.processes.is_null()) summary["processes"] = outcome.processes;
  summary["stopped_early"] = outcome.stopped;
  return summary;
}

/// "peak activation memory per stage: 1.2 MB, 0.8 MB", when the run reported its stages.
void print_peak_memory(const run_outcome& outcome, const actors::job_config& config) {
  if (!outcome.stages.is_array() || outcome.stages.empty()) return;
  std::string memory;
  for (const auto& stage : outcome.stages) {
    char text[32];
    std::snprintf(text, sizeof text, "%s%.1f MB", memory.empty() ? "" : ", ",
                  stage.value("peak_activation_bytes", int64_t{0}) / 1e6);
    memory += text;
  }
  std::printf("peak activation memory per stage: %s%s\n", memory.c_str(),
              config.parallelism.recompute ? " (recompute)" : "");
}

/// "staleness per node (mean over keys): embed 0.00, middle 0.31, top 0.00" for a graph's async
/// run ("per stage" for a chain's): how many updates a stage's weights took between a key's
/// forward and backward pass there, on average.
void print_staleness(const run_outcome& outcome, const actors::job_config& config) {
  if (config.parallelism.mode != actors::pipeline_mode::async || !outcome.stages.is_array() ||
      outcome.stages.empty() || config.parallelism.replicas > 1)
    return;
  std::string text;
  bool by_node = false;
  for (const auto& stage : outcome.stages) {
    const double mean = stage.value("mean_staleness", 0.0);
    char figure[32];
    std::snprintf(figure, sizeof figure, "%.2f", mean);
    const nlohmann::json nodes = stage.value("nodes", nlohmann::json());
    if (nodes.is_array() && !nodes.empty()) {
      by_node = true;
      for (const auto& node : nodes)
        text += (text.empty() ? "" : ", ") + node.get<std::string>() + " " + figure;
    } else {
      text += (text.empty() ? "" : ", ") + std::string(figure);
    }
  }
  std::printf("staleness per %s (mean over keys): %s\n", by_node ? "node" : "stage", text.c_str());
}

/// The run's closing line: its final figures, steps, epochs and speed. A run stopped before
/// its first evaluation has no figure to give: it says so.
void print_result(const actors::training_summary& summary) {
  if (summary.tokens_per_s) {
    char figures[96] = "no evaluation yet";
    if (summary.bits_per_byte) {
      std::snprintf(figures, sizeof figures, "validation_loss %.4f  bits_per_byte %.4f",
                    summary.final_test_loss, *summary.bits_per_byte);
    }
    std::printf("%s  steps %lld  epochs %lld  %.0f tokens/s  %.1f s\n", figures,
                static_cast<long long>(summary.steps), static_cast<long long>(summary.epochs),
                summary.tokens_per_s.value_or(0.0), summary.wall_s);
    return;
  }
  char accuracy[64] = "no evaluation yet";
  if (summary.evaluated) {
    std::snprintf(accuracy, sizeof accuracy, "final_test_accuracy %.4f",
                  summary.final_test_accuracy);
  }
  std::printf("%s  steps %lld  epochs %lld  %.0f samples/s  %.1f s\n", accuracy,
              static_cast<long long>(summary.steps), static_cast<long long>(summary.epochs),
              summary.samples_per_s, summary.wall_s);
}

/// Writes summary.json, hands it to the monitor and prints the result; the exit status.
int finish_run(const training_job& job, const run_outcome& outcome, actors::run_monitor* monitor) {
  const nlohmann::json summary = summary_json_of(outcome);
  if (monitor) monitor->set_finished(summary);
  std::string error;
  if (!write_json_file(job.out + "/summary.json", summary, &error)) {
    std::fprintf(stderr, "troupe: %s\n", error.c_str());
    return 1;
  }
  if (outcome.stopped) {
    std::fprintf(stderr,
                 "troupe: stopped at step %lld after a checkpoint; continue with --resume\n",
                 static_cast<long long>(outcome.summary.steps));
  }
  print_peak_memory(outcome, job.config);
  print_staleness(outcome, job.config);
  print_result(outcome.summary);
  return 0;
}

}  // namespace

int run_train(const train_options& given) {
  training_job job;
  if (const int status = load_training_job(given, &job)) return status;
  const train_options& options = job.options;
  std::string error;
  if (!make_directory(job.out, &error) ||
      !write_json_file(job.out + "/config.json", actors::to_json(job.config), &error)) {
    return bad_input(error);
  }
  auto pipeline = run_settings(job.config, options, job.out, &error);
  if (!pipeline) return bad_input(error);
  pipeline->checkpoint_requests = install_run_signals();
  pipeline->status_requests = status_requests();
  run_watch watch;
  if (!watch_run(job, &watch, &error)) return bad_input(error);
  pipeline->monitor = watch.monitor.get();
  metrics_log log(job.out + "/metrics.jsonl", options.resume);
  if (!log.ok()) return bad_input("cannot write " + job.out + "/metrics.jsonl");
  announce(job);
  const int64_t per_epoch = job.data->train.count() / job.config.training.batch_size;
  const bool interactive = !options.quiet && job.config.metrics.progress && isatty(STDERR_FILENO);
  run_reporter reporter(&log, stderr, interactive, per_epoch, job.config.training.epochs);
  reporter.show_on(watch.monitor.get());
  const auto outcome = train_job(job, *pipeline, reporter);
  if (!outcome) return 1;
  return finish_run(job, *outcome, watch.monitor.get());
}

}  // namespace troupe::apps
