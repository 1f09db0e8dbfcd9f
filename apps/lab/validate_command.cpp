// `troupe validate JOB`: runs the job for real on this machine (in one process and with worker
// processes; sync and async; 1, 2 and 4 stages), simulates each run with this machine's
// calibrated profile, and prints measured against predicted samples/s.

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/config/layer_cuts.h"
#include "actors/hosts/replica_groups.h"
#include "apps/cli/child_train.h"
#include "apps/cli/commands.h"
#include "apps/cli/partition_choice.h"
#include "apps/cli/run_output.h"
#include "apps/lab/statistics.h"
#include "apps/lab/validation_table.h"
#include "sim/calibration/calibrate.h"
#include "sim/calibration/this_machine.h"
#include "sim/profile.h"
#include "sim/simulation.h"

namespace troupe::apps {
namespace {

using json = nlohmann::json;

/// This machine's cores (its devices in sim::this_machine()).
unsigned this_machines_cores() { return std::max(1u, std::thread::hardware_concurrency()); }

/// A log record's step and when it was written, in seconds since the run started.
struct step_record {
  int64_t step = 0;
  double wall_s = 0;
};

/// Samples per second from the first log record at or past `warm_up_steps` to the last one
/// (evaluation records left out): the same for a real run and its simulation, so that neither
/// counts the start of the run, whose cold caches, connections and page faults the simulator
/// does not model. Nothing when no record follows the warm-up.
std::optional<double> steady_samples_per_s(const std::vector<step_record>& records,
                                           int64_t warm_up_steps, int64_t batch_size) {
  const auto start = std::find_if(records.begin(), records.end(), [&](const step_record& record) {
    return record.step >= warm_up_steps;
  });
  if (start == records.end()) return std::nullopt;
  const step_record& end = records.back();
  if (end.step <= start->step || end.wall_s <= start->wall_s) return std::nullopt;
  return static_cast<double>((end.step - start->step) * batch_size) / (end.wall_s - start->wall_s);
}

/// What one real run measured.
struct measured_run {
  double samples_per_s = 0;          ///< over the whole run
  std::vector<step_record> records;  ///< from its metrics.jsonl
  double cpu_s = 0;                  ///< all its processes' CPU time, user and kernel
  double system_s = 0;               ///< of which in the kernel
  double samples = 0;                ///< training samples (steps × batch size)
};

/// Trains the job for real in a process of its own (a fresh `troupe train`, as a user runs
/// it: nothing of earlier runs or of the calibration stays in its heap or its threads) and
/// returns what it measured. Its output goes to `out`/train.log.
std::optional<measured_run> measure_run(const validate_options& options,
                                        const std::vector<std::string>& overrides, int workers,
                                        int64_t batch_size, const std::string& out) {
  const auto summary = train_in_child_process(options.job_file, overrides, workers, out);
  if (!summary) return std::nullopt;
  measured_run run;
  run.samples_per_s = summary->value("samples_per_s", 0.0);
  for (const json& process : summary->value("processes", json::array())) {
    run.system_s += process.value("system_s", 0.0);
    run.cpu_s += process.value("user_s", 0.0) + process.value("system_s", 0.0);
  }
  run.samples = static_cast<double>(summary->value("steps", int64_t{0}) * batch_size);
  std::ifstream metrics(out + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const json record = json::parse(line, nullptr, false);
    if (record.is_discarded() || record.contains("test_accuracy")) continue;
    run.records.push_back({record.value("step", int64_t{0}), record.value("wall_s", 0.0)});
  }
  return run;
}

/// One configuration of the job validated: its mode, pipeline depth and replicas, as it loads
/// with the validation's settings.
struct configuration {
  std::string mode;
  int stages = 1;
  int replicas = 1;
  std::string name;                    ///< "sync-s2", "async-s4-r2"
  std::vector<std::string> overrides;  ///< the job's, then the configuration's
  std::optional<actors::job_config> config;
  std::optional<actors::job_data> data;
  /// The rows' worker processes: 0 (in one process), then one per stage actor where the job
  /// can run so.
  std::vector<int> placements{0};

  int stage_actors() const { return stages * replicas; }
};

/// The simulated samples/s after the warm-up and over the whole run.
struct prediction {
  double steady = 0, whole = 0;
};

/// A calibration's predictions: [0] in one process, [1] with a worker process per stage actor.
using predictions = std::array<prediction, 2>;

/// Why R replicas cannot run in worker processes ("" when they can), by R; counts the table's
/// rows: each configuration in one process, and with worker processes where it can run so.
std::map<int, std::string> reasons_not_across(const validate_options& options,
                                              size_t* expected_rows) {
  std::map<int, std::string> not_across;
  for (const int replicas : options.replicas) {
    std::vector<std::string> overrides = options.overrides;
    overrides.push_back("parallelism.replicas=" + std::to_string(replicas));
    actors::job_error problem;
    const auto config = actors::load_job_file(options.job_file, overrides, &problem);
    if (config) not_across[replicas] = actors::replica_group_problem(*config, false);
    *expected_rows += (not_across[replicas].empty() ? 4 : 2) * options.stages.size();
  }
  return not_across;
}

/// The settings that make the job `configuration`, a short run logged once per warm-up.
std::vector<std::string> configuration_settings(const validate_options& options,
                                                const configuration& c, int64_t warm_up_steps) {
  return {"parallelism.mode=\"" + c.mode + "\"",
          "parallelism.stages=" + std::to_string(c.stages),
          "parallelism.replicas=" + std::to_string(c.replicas),
          "parallelism.micro_batches=" + std::string(c.mode == "sync" ? "4" : "1"),
          "parallelism.max_active_keys=" + std::to_string(c.stages),
          "parallelism.min_update_interval=1",
          "training.epochs=1",
          "training.max_steps=" + std::to_string(options.steps),
          "metrics.log_interval=" + std::to_string(warm_up_steps),
          "checkpoint.interval_steps=0"};
}

/// Loads the configuration's job and data, its partition chosen once; 0, or the exit status
/// after saying what failed. `not_across` says why it cannot run in worker processes.
int load_configuration(const validate_options& options, const std::string& not_across,
                       int64_t warm_up_steps, configuration* c, validation_table* table) {
  c->overrides = options.overrides;
  for (const std::string& setting : configuration_settings(options, *c, warm_up_steps)) {
    c->overrides.push_back(setting);
  }
  actors::job_error problem;
  c->config = actors::load_job_file(options.job_file, c->overrides, &problem);
  if (!c->config) {
    std::fprintf(stderr, "troupe validate: %s\n", problem.message.c_str());
    return 2;
  }
  std::string error;
  // "measured" is timed once here, so that the real runs and the calibrations cut alike.
  if (c->config->parallelism.partition == "measured" && c->stages > 1) {
    auto line = choose_partition(&*c->config, "", &error);
    if (!line) {
      std::fprintf(stderr, "troupe validate: %s: %s\n", options.job_file.c_str(), error.c_str());
      return 2;
    }
    std::fprintf(stderr, "troupe validate: %s\n", line->c_str());
    c->overrides.push_back("parallelism.partition=\"" +
                           actors::written_job(*c->config).parallelism.partition + "\"");
  }
  c->data = actors::load_job_data(*c->config, &error);
  if (!c->data) {
    std::fprintf(stderr, "troupe validate: %s\n", error.c_str());
    return 1;
  }
  c->name = c->mode + "-s" + std::to_string(c->stages) +
            (c->replicas > 1 ? "-r" + std::to_string(c->replicas) : "");
  // Replicas that sum through shared memory cannot run in worker processes.
  if (not_across.empty()) {
    c->placements.push_back(c->stage_actors());
  } else {
    table->add_note("(" + c->name + ": no --workers row: " + not_across + ")");
  }
  return 0;
}

/// The simulated samples/s of the configuration on `machine` with `workers` worker processes
/// (0: in one process), from `profile`.
std::optional<prediction> predict(const configuration& c, const sim::machine_profile& profile,
                                  const sim::cluster_model& machine, int workers,
                                  int64_t warm_up_steps, std::string* error) {
  sim::simulation_options settings;
  settings.trace_spans = 0;
  settings.profile = profile;
  settings.message_cpu_s = workers == 0 ? profile.inproc_message_cpu_s : profile.ipc_message_cpu_s;
  settings.message_cpu_per_byte_s =
      workers == 0 ? profile.inproc_message_cpu_per_byte_s : profile.ipc_message_cpu_per_byte_s;
  struct : actors::training_observer {
    void on_step(int64_t, int64_t, int64_t, double, double) override {}
    void on_metrics(const actors::metrics_record& record) override {
      if (!record.test_accuracy) records.push_back({record.step, record.wall_s});
    }
    std::vector<step_record> records;
  } simulated;
  auto result = sim::simulate(*c.config, *c.data, machine, settings, simulated, error);
  if (!result) return std::nullopt;
  const double whole = result->summary.samples_per_s;
  return prediction{
      steady_samples_per_s(simulated.records, warm_up_steps, c.config->training.batch_size)
          .value_or(whole),
      whole};
}

/// Calibration `index` (1 to runs + 1) of the configuration, its profile kept beside the runs,
/// and its predictions; nothing after saying what failed.
std::optional<predictions> calibrate(const validate_options& options, const configuration& c,
                                     const std::string& out, int index, int64_t warm_up_steps) {
  std::string error;
  auto profile = sim::calibrate(*c.config, options.seconds, &error);
  auto in_process = profile ? sim::this_machine(*profile, true, &error) : std::nullopt;
  auto across_processes = in_process ? sim::this_machine(*profile, false, &error) : std::nullopt;
  auto alone =
      across_processes ? predict(c, *profile, *in_process, 0, warm_up_steps, &error) : std::nullopt;
  auto with_workers =
      alone ? predict(c, *profile, *across_processes, c.stage_actors(), warm_up_steps, &error)
            : std::nullopt;
  if (!with_workers) {
    std::fprintf(stderr, "troupe validate: %s\n", error.c_str());
    return std::nullopt;
  }
  std::ofstream(out + "/" + c.name + "-profile-" + std::to_string(index) + ".json")
      << sim::to_json_text(*profile);
  return predictions{*alone, *with_workers};
}

/// Run `run` (from 0) of the configuration with `workers` worker processes, its measurements
/// added to `result`; false after saying that it failed.
bool measure(const validate_options& options, const configuration& c, int workers, int run,
             const std::string& out, int64_t warm_up_steps, configuration_runs* result) {
  const int column = workers ? 1 : 0;
  const std::string run_name = c.name + (workers ? "-workers" : "") + "-" + std::to_string(run + 1);
  const std::string directory = out + "/" + run_name;
  const int64_t batch_size = c.config->training.batch_size;
  auto rate = measure_run(options, c.overrides, workers, batch_size, directory);
  if (!rate) {
    std::fprintf(stderr, "troupe validate: the run %s failed (see %s/train.log)\n",
                 run_name.c_str(), directory.c_str());
    return false;
  }
  result->whole_measured[column].push_back(rate->samples_per_s);
  result->measured[column].push_back(
      steady_samples_per_s(rate->records, warm_up_steps, batch_size).value_or(rate->samples_per_s));
  result->cpu_us_per_sample[column].push_back(rate->samples > 0 ? 1e6 * rate->cpu_s / rate->samples
                                                                : 0);
  result->kernel_fraction[column].push_back(rate->cpu_s > 0 ? rate->system_s / rate->cpu_s : 0);
  return true;
}

/// A run's predictions: the mean of the calibrations' just before and just after it.
void record_predictions(const predictions& before, const predictions& after,
                        configuration_runs* result) {
  for (int column : {0, 1}) {
    const prediction& first = before[column];
    const prediction& second = after[column];
    result->predicted_before[column].push_back(first.steady);
    result->predicted_after[column].push_back(second.steady);
    result->predicted[column].push_back((first.steady + second.steady) / 2);
    result->whole_predicted[column].push_back((first.whole + second.whole) / 2);
  }
}

/// Calibrations and real runs alternate, and each run is predicted from the calibrations just
/// before and just after it (the mean of their predictions): a shared machine's speed drifts
/// over minutes, and the two calibrations see the machine the run saw. The row quotes medians
/// over the runs, as one run in five or so is 15-30% slow either way. Nothing after saying
/// what failed.
std::optional<configuration_runs> run_configuration(const validate_options& options,
                                                    const configuration& c, const std::string& out,
                                                    int64_t warm_up_steps) {
  configuration_runs result;
  auto before = calibrate(options, c, out, 1, warm_up_steps);
  if (!before) return std::nullopt;
  for (int run = 0; run < options.runs; ++run) {
    for (int workers : c.placements) {
      if (!measure(options, c, workers, run, out, warm_up_steps, &result)) return std::nullopt;
    }
    auto after = calibrate(options, c, out, run + 2, warm_up_steps);
    if (!after) return std::nullopt;
    record_predictions(*before, *after, &result);
    before = std::move(after);
  }
  return result;
}

/// Says how the simulator treats more worker processes than this machine has cores, when the
/// validation starts that many.
void print_time_slicing_note(const validate_options& options) {
  const unsigned cores = this_machines_cores();
  if (static_cast<unsigned>(*std::max_element(options.stages.begin(), options.stages.end()) *
                            *std::max_element(options.replicas.begin(), options.replicas.end())) >
      cores) {
    std::printf(
        "(rows with --workers above %u: more single-stage processes than this machine's cores, "
        "which the operating system time-slices; the simulator gives them the share of the "
        "cores (time_slice_efficiency in the profiles) at which it runs the job as fast as a "
        "stand-in pipeline of the job's stage processes ran in each calibration)\n",
        cores);
  }
}

}  // namespace

int run_validate(const validate_options& options) {
  const std::string out = options.out_directory.empty() ? "runs/validate" : options.out_directory;
  std::string error;
  if (!make_directory(out, &error)) {
    std::fprintf(stderr, "troupe validate: %s\n", error.c_str());
    return 2;
  }
  // The first tenth of every run is its warm-up, which neither side's samples/s counts.
  const int64_t warm_up_steps = std::max(1, options.steps / 10);
  const bool replicated = std::any_of(options.replicas.begin(), options.replicas.end(),
                                      [](int replicas) { return replicas > 1; });
  size_t expected_rows = 0;
  std::map<int, std::string> not_across = reasons_not_across(options, &expected_rows);
  validation_table table(warm_up_steps, replicated, expected_rows);
  for (const std::string mode : {"sync", "async"}) {
    for (const int replicas : options.replicas) {
      for (int stages : options.stages) {
        configuration c{mode, stages, replicas};
        if (const int status =
                load_configuration(options, not_across[replicas], warm_up_steps, &c, &table)) {
          return status;
        }
        const auto result = run_configuration(options, c, out, warm_up_steps);
        if (!result) return 1;
        for (int workers : c.placements) table.add_row({mode, stages, replicas, workers}, *result);
      }
    }
  }
  table.print(options.runs);
  print_time_slicing_note(options);
  if (!write_json_file(out + "/validation.json", table.rows(), &error)) {
    std::fprintf(stderr, "troupe validate: %s\n", error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace troupe::apps
