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

/// One configuration's predictions and measurements, run by run.
struct configuration_runs {
  std::vector<double> predicted[2];         ///< [0]: in-process, [1]: --workers; after the warm-up
  std::vector<double> predicted_before[2];  ///< by the calibration just before each run alone
  std::vector<double> predicted_after[2];   ///< by the one just after it alone
  std::vector<double> measured[2];
  std::vector<double> whole_predicted[2];  ///< over the whole run
  std::vector<double> whole_measured[2];
  std::vector<double> cpu_us_per_sample[2];
  std::vector<double> kernel_fraction[2];
};

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
  json rows = json::array();
  std::vector<std::string> lines;
  std::vector<std::string> notes;
  size_t within_rows = 0;      // rows whose error is within 10 %
  size_t unresolved_rows = 0;  // the others whose error the machine's own drift could explain
  // Each configuration in one process and with a worker process per stage actor.
  const bool replicated = std::any_of(options.replicas.begin(), options.replicas.end(),
                                      [](int replicas) { return replicas > 1; });
  // Rows: each configuration in one process, and with worker processes where it can run so.
  // Why R replicas cannot run in worker processes ("" when they can), by R.
  std::map<int, std::string> not_across;
  size_t expected_rows = 0;
  for (const int replicas : options.replicas) {
    std::vector<std::string> overrides = options.overrides;
    overrides.push_back("parallelism.replicas=" + std::to_string(replicas));
    actors::job_error problem;
    const auto config = actors::load_job_file(options.job_file, overrides, &problem);
    if (config) not_across[replicas] = actors::replica_group_problem(*config, false);
    expected_rows += (not_across[replicas].empty() ? 4 : 2) * options.stages.size();
  }
  for (const std::string mode : {"sync", "async"}) {
    for (const int replicas : options.replicas) {
      for (int stages : options.stages) {
        std::vector<std::string> overrides = options.overrides;
        for (const std::string& setting : std::vector<std::string>{
                 "parallelism.mode=\"" + mode + "\"",
                 "parallelism.stages=" + std::to_string(stages),
                 "parallelism.replicas=" + std::to_string(replicas),
                 "parallelism.micro_batches=" + std::string(mode == "sync" ? "4" : "1"),
                 "parallelism.max_active_keys=" + std::to_string(stages),
                 "parallelism.min_update_interval=1", "training.epochs=1",
                 "training.max_steps=" + std::to_string(options.steps),
                 "metrics.log_interval=" + std::to_string(warm_up_steps),
                 "checkpoint.interval_steps=0"}) {
          overrides.push_back(setting);
        }
        actors::job_error problem;
        auto config = actors::load_job_file(options.job_file, overrides, &problem);
        if (!config) {
          std::fprintf(stderr, "troupe validate: %s\n", problem.message.c_str());
          return 2;
        }
        // "measured" is timed once here, so that the real runs and the calibrations cut alike.
        if (config->parallelism.partition == "measured" && stages > 1) {
          auto line = choose_partition(&*config, "", &error);
          if (!line) {
            std::fprintf(stderr, "troupe validate: %s: %s\n", options.job_file.c_str(),
                         error.c_str());
            return 2;
          }
          std::fprintf(stderr, "troupe validate: %s\n", line->c_str());
          overrides.push_back("parallelism.partition=\"" +
                              actors::written_job(*config).parallelism.partition + "\"");
        }
        auto data = actors::load_job_data(*config, &error);
        if (!data) {
          std::fprintf(stderr, "troupe validate: %s\n", error.c_str());
          return 1;
        }
        const std::string name = mode + "-s" + std::to_string(stages) +
                                 (replicas > 1 ? "-r" + std::to_string(replicas) : "");
        const int actors_count = stages * replicas;
        // In one process, and with a worker process per stage actor where the job can run so
        // (replicas that sum through shared memory cannot).
        std::vector<int> placements{0};
        if (not_across[replicas].empty()) {
          placements.push_back(actors_count);
        } else {
          notes.push_back("(" + name + ": no --workers row: " + not_across[replicas] + ")");
        }
        // The simulated samples/s after the warm-up and over the whole run on `machine`, with
        // `workers` worker processes (0: in one process).
        struct prediction {
          double steady = 0, whole = 0;
        };
        const auto predict = [&](const sim::machine_profile& profile,
                                 const sim::cluster_model& machine,
                                 int workers) -> std::optional<prediction> {
          sim::simulation_options settings;
          settings.trace_spans = 0;
          settings.profile = profile;
          settings.message_cpu_s =
              workers == 0 ? profile.inproc_message_cpu_s : profile.ipc_message_cpu_s;
          settings.message_cpu_per_byte_s = workers == 0 ? profile.inproc_message_cpu_per_byte_s
                                                         : profile.ipc_message_cpu_per_byte_s;
          struct : actors::training_observer {
            void on_step(int64_t, int64_t, int64_t, double, double) override {}
            void on_metrics(const actors::metrics_record& record) override {
              if (!record.test_accuracy) records.push_back({record.step, record.wall_s});
            }
            std::vector<step_record> records;
          } simulated;
          auto result = sim::simulate(*config, *data, machine, settings, simulated, &error);
          if (!result) return std::nullopt;
          const double whole = result->summary.samples_per_s;
          return prediction{
              steady_samples_per_s(simulated.records, warm_up_steps, config->training.batch_size)
                  .value_or(whole),
              whole};
        };
        // Calibration `index` (1 to runs + 1), its profile kept beside the runs, and its
        // predictions: [0] in one process, [1] with a worker process per stage.
        using predictions = std::array<prediction, 2>;
        const auto calibrate = [&](int index) -> std::optional<predictions> {
          auto profile = sim::calibrate(*config, options.seconds, &error);
          auto in_process = profile ? sim::this_machine(*profile, true, &error) : std::nullopt;
          auto across_processes =
              in_process ? sim::this_machine(*profile, false, &error) : std::nullopt;
          auto alone = across_processes ? predict(*profile, *in_process, 0) : std::nullopt;
          auto with_workers =
              alone ? predict(*profile, *across_processes, actors_count) : std::nullopt;
          if (!with_workers) {
            std::fprintf(stderr, "troupe validate: %s\n", error.c_str());
            return std::nullopt;
          }
          std::ofstream(out + "/" + name + "-profile-" + std::to_string(index) + ".json")
              << sim::to_json_text(*profile);
          return predictions{*alone, *with_workers};
        };
        // Calibrations and real runs alternate, and each run is predicted from the calibrations
        // just before and just after it (the mean of their predictions): a shared machine's speed
        // drifts over minutes, and the two calibrations see the machine the run saw. The row
        // quotes medians over the runs, as one run in five or so is 15-30% slow either way.
        configuration_runs result;
        auto before = calibrate(1);
        if (!before) return 1;
        for (int run = 0; run < options.runs; ++run) {
          const std::string suffix = "-" + std::to_string(run + 1);
          for (int workers : placements) {
            const int column = workers ? 1 : 0;
            const std::string run_name = name + (workers ? "-workers" : "") + suffix;
            const std::string directory = out + "/" + run_name;
            auto rate =
                measure_run(options, overrides, workers, config->training.batch_size, directory);
            if (!rate) {
              std::fprintf(stderr, "troupe validate: the run %s failed (see %s/train.log)\n",
                           run_name.c_str(), directory.c_str());
              return 1;
            }
            result.whole_measured[column].push_back(rate->samples_per_s);
            result.measured[column].push_back(
                steady_samples_per_s(rate->records, warm_up_steps, config->training.batch_size)
                    .value_or(rate->samples_per_s));
            result.cpu_us_per_sample[column].push_back(
                rate->samples > 0 ? 1e6 * rate->cpu_s / rate->samples : 0);
            result.kernel_fraction[column].push_back(rate->cpu_s > 0 ? rate->system_s / rate->cpu_s
                                                                     : 0);
          }
          auto after = calibrate(run + 2);
          if (!after) return 1;
          for (int column : {0, 1}) {
            const prediction& first = (*before)[column];
            const prediction& second = (*after)[column];
            result.predicted_before[column].push_back(first.steady);
            result.predicted_after[column].push_back(second.steady);
            result.predicted[column].push_back((first.steady + second.steady) / 2);
            result.whole_predicted[column].push_back((first.whole + second.whole) / 2);
          }
          before = std::move(after);
        }
        for (int workers : placements) {
          const int column = workers ? 1 : 0;
          const double measured = median(result.measured[column]);
          const double predicted = median(result.predicted[column]);
          // The error of each run against its own prediction, then their median: the pairs
          // cancel the machine's drift, which the medians of each column alone do not.
          std::vector<double> errors;
          for (size_t run = 0; run < result.measured[column].size(); ++run) {
            errors.push_back(result.predicted[column][run] / result.measured[column][run] - 1);
          }
          const double relative = median(errors);
          const std::string where =
              workers == 0 ? "in-process" : "--workers " + std::to_string(workers);
          const double cpu = median(result.cpu_us_per_sample[column]);
          const double kernel = median(result.kernel_fraction[column]);
          // How much this machine's speed moved while the row ran: the configuration's
          // calibrations minutes apart, and its real runs, each largest over smallest.
          std::vector<double> calibrations = result.predicted_before[column];
          if (!result.predicted_after[column].empty()) {
            calibrations.push_back(result.predicted_after[column].back());
          }
          const double calibration_spread = spread(calibrations);
          const double run_spread = spread(result.measured[column]);
          const bool within = std::abs(relative) <= 0.10;
          within_rows += within ? 1 : 0;
          unresolved_rows +=
              !within && std::abs(relative) <= std::max(calibration_spread, run_spread) ? 1 : 0;
          char replica_column[16] = "";
          if (replicated) std::snprintf(replica_column, sizeof replica_column, " %8d", replicas);
          char line[240];
          std::snprintf(line, sizeof line,
                        "%-6s %6d%s  %-12s %12.1f %12.1f %+8.1f%% %9.0f %6.0f%% %10.0f%% %7.0f%%",
                        mode.c_str(), stages, replica_column, where.c_str(), measured, predicted,
                        100 * relative, cpu, 100 * kernel, 100 * calibration_spread,
                        100 * run_spread);
          lines.push_back(line);
          std::fprintf(stderr, "troupe validate: [%zu/%zu] %s\n", lines.size(), expected_rows,
                       line);  // in-process and --workers
          rows.push_back({{"mode", mode},
                          {"stages", stages},
                          {"replicas", replicas},
                          {"workers", workers},
                          {"measured_samples_per_s", measured},
                          {"measured_runs", result.measured[column]},
                          {"predicted_samples_per_s", predicted},
                          {"predicted_runs", result.predicted[column]},
                          {"predicted_before_runs", result.predicted_before[column]},
                          {"predicted_after_runs", result.predicted_after[column]},
                          {"whole_run_measured_runs", result.whole_measured[column]},
                          {"whole_run_predicted_runs", result.whole_predicted[column]},
                          {"warm_up_steps", warm_up_steps},
                          {"error", relative},
                          {"cpu_us_per_sample", cpu},
                          {"kernel_fraction", kernel},
                          {"calibration_spread", calibration_spread},
                          {"run_spread", run_spread}});
        }
      }
    }
  }
  std::printf("%-6s %6s%s  %-12s %12s %12s %9s %9s %7s %11s %8s\n", "mode", "stages",
              replicated ? " replicas" : "", "run", "measured", "predicted", "error", "cpu",
              "kernel", "calibrated", "runs");
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  std::printf(
      "(samples/s after each run's first %lld steps, its warm-up; medians of %d runs; each run "
      "is predicted from the calibrations taken just before and just after it, and error is the "
      "median of the runs' predicted/measured - 1)\n",
      static_cast<long long>(warm_up_steps), options.runs);
  std::printf(
      "(cpu: microseconds of CPU time per training sample, all the run's processes together, "
      "user and kernel, from their start; kernel: the kernel's share of it)\n");
  std::printf(
      "(calibrated, runs: how far apart the row's calibrations, and its real runs, came out: "
      "largest over smallest - 1; the machine's own change of speed while the row ran)\n");
  std::printf("%zu of %zu rows within 10%%", within_rows, lines.size());
  if (unresolved_rows > 0) {
    std::printf(
        "; %zu more whose error is inside its calibrations' or runs' spread: this "
        "machine changed speed more than the error while they ran, so more --runs, or "
        "a quieter machine, would tell",
        unresolved_rows);
  }
  std::printf("\n");
  for (const std::string& note : notes) std::printf("%s\n", note.c_str());
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
  if (!write_json_file(out + "/validation.json", rows, &error)) {
    std::fprintf(stderr, "troupe validate: %s\n", error.c_str());
    return 1;
  }
  return 0;
}

}  // namespace troupe::apps
