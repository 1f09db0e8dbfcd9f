// `troupe simulate JOB --cluster FILE`: the job's pipeline in virtual time on a modelled
// cluster (sim/), with a table on stdout and summary.json / trace.json in the output directory.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "apps/cli/commands.h"
#include "apps/cli/partition_choice.h"
#include "apps/cli/run_output.h"
#include "apps/cli/simulation_report.h"
#include "apps/cli/simulation_settings.h"
#include "apps/cli/sweep_option.h"
#include "sim/simulation.h"

namespace troupe::apps {
namespace {

using json = nlohmann::json;

int bad_input(const std::string& message) {
  std::fprintf(stderr, "troupe simulate: %s\n", message.c_str());
  return 2;
}

/// Writes numerics-mode metrics to metrics.jsonl; timing-only runs report nothing per step.
class simulation_observer final : public actors::training_observer {
 public:
  explicit simulation_observer(metrics_log* log) : log_(log) {}
  void on_step(int64_t, int64_t, int64_t, double, double) override {}
  void on_metrics(const actors::metrics_record& record) override {
    if (log_) log_->append(to_json(record));
  }
  /// Worker losses and recoveries, in numerics mode next to the metrics they interrupt.
  void on_event(const nlohmann::json& event) override {
    if (log_) log_->append(event);
  }

 private:
  metrics_log* log_;
};

/// The table's rows: each --setting, then each value of --sweep; the job alone without them.
struct simulation_plan {
  std::vector<setting> rows;
  bool table = false;  ///< a row per setting (else the job alone, printed in detail)
  std::string sweep_key;
  std::string row_heading;
  /// A sweep over the replicas is a weak-scaling study: each replica keeps the job's batch
  /// per replica, so training.batch_size grows with them.
  bool weak_scaling = false;
  std::vector<actors::job_config> configs;  ///< each row's job
  double first_rate_per_replica = 0;        ///< weak scaling: the first row's samples/s
};

/// The rows of --setting and --sweep; false with `error` set when either does not parse.
bool plan_rows(const simulate_options& options, simulation_plan* plan, std::string* error) {
  std::optional<sweep_option> sweep;
  if (!options.sweep.empty() && !(sweep = parse_sweep(options.sweep, error))) return false;
  plan->sweep_key = sweep ? sweep->key : "";
  auto rows = parse_settings(options.settings, sweep, error);
  if (!rows) return false;
  plan->rows = std::move(*rows);
  plan->table = !plan->rows.empty();
  if (!plan->table) plan->rows.push_back({"", {}, ""});
  plan->row_heading = options.settings.empty() ? plan->sweep_key : "setting";
  plan->weak_scaling = options.settings.empty() && plan->sweep_key == "parallelism.replicas";
  return true;
}

/// Every row's job, read before the table starts, so that a bad setting is one line of error,
/// not a header without rows; 0, or 2 after saying what is wrong.
int load_row_jobs(const simulate_options& options, simulation_plan* plan) {
  int64_t batch_per_replica = 0;
  if (plan->weak_scaling) {
    actors::job_error problem;
    auto base = actors::load_job_file(options.job_file, options.overrides, &problem);
    if (!base) return bad_input(problem.message);
    batch_per_replica = base->training.batch_size / base->parallelism.replicas;
    std::printf("weak scaling: training.batch_size = %lld per replica\n",
                static_cast<long long>(batch_per_replica));
  }
  for (const setting& row : plan->rows) {
    std::vector<std::string> overrides = options.overrides;
    overrides.insert(overrides.end(), row.overrides.begin(), row.overrides.end());
    if (plan->weak_scaling) {
      const int64_t replicas = std::max<int64_t>(1, std::atoll(row.swept.c_str()));
      overrides.push_back("training.batch_size=" + std::to_string(batch_per_replica * replicas));
    }
    actors::job_error problem;
    auto config = actors::load_job_file(options.job_file, overrides, &problem);
    if (!config) {
      return bad_input((plan->table ? "setting " + row.name + ": " : "") + problem.message);
    }
    plan->configs.push_back(std::move(*config));
  }
  return 0;
}

void print_table_header(const simulation_plan& plan, bool numerics) {
  std::printf("%-16s %12s %12s %10s %10s %10s %12s%s%s\n", plan.row_heading.c_str(), "samples/s",
              "tokens/s", "mean util", "max stale", "peak GB", "simulated s",
              plan.weak_scaling ? "   batch  weak eff  busiest link" : "",
              numerics ? "   accuracy  to target s" : "");
}

/// Chooses the row's partition and says what the user should know of it; 0, or 2 after saying
/// what is wrong.
int prepare_row(const simulate_options& options, const simulation_plan& plan, size_t index,
                actors::job_config* config) {
  std::string error;
  if (!estimate_measured_partition(config, &error)) {
    return bad_input(options.job_file + ": " + error);
  }
  if (!plan.table) {
    const std::string hint = layer_cut_hint(*config);
    if (!hint.empty()) std::fprintf(stderr, "%s\n", hint.c_str());
  }
  if (const std::string note = interleaving_note(*config, plan.table); !note.empty()) {
    std::fprintf(stderr, "%s%s\n", note.c_str(),
                 plan.table ? (" (the row " + plan.rows[index].name + ")").c_str() : "");
  }
  return 0;
}

/// sim::simulate(), with the wall-clock time it took.
std::optional<sim::simulation_result> timed_simulation(const actors::job_config& config,
                                                       const actors::job_data& data,
                                                       const sim::cluster_model& cluster,
                                                       const sim::simulation_options& settings,
                                                       actors::training_observer& observer,
                                                       std::string* error) {
  const auto start = std::chrono::steady_clock::now();
  auto result = sim::simulate(config, data, cluster, settings, observer, error);
  if (!result) return std::nullopt;
  result->wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result->events_per_s = static_cast<double>(result->events) / std::max(1e-9, result->wall_s);
  return result;
}

/// The weak-scaling columns of a row: its batch, its samples/s per replica against the first
/// row's, and its busiest link; added to its summary too.
void print_weak_scaling(const sim::simulation_result& result, const actors::job_config& config,
                        simulation_plan* plan, json* summary) {
  const double per_replica =
      result.summary.samples_per_s / std::max(1, config.parallelism.replicas);
  if (plan->first_rate_per_replica == 0) plan->first_rate_per_replica = per_replica;
  const double efficiency = per_replica / std::max(1e-12, plan->first_rate_per_replica);
  double busiest = 0;
  std::string link = "-";
  for (size_t i = 0; i < result.link_utilization.size(); ++i) {
    if (result.link_utilization[i] > busiest) {
      busiest = result.link_utilization[i];
      link = result.link_names[i];
    }
  }
  (*summary)["weak_scaling_efficiency"] = efficiency;
  (*summary)["busiest_link"] = {{"link", link}, {"utilization", busiest}};
  std::printf(" %7lld %8.1f%%  %s %.0f%%", static_cast<long long>(config.training.batch_size),
              100 * efficiency, link.c_str(), 100 * busiest);
}

/// Row `index` of the table; its summary gains the row's name or swept value.
void print_table_row(const sim::simulation_result& result, size_t index, bool numerics,
                     simulation_plan* plan, json* summary) {
  const std::string& name = plan->rows[index].name;
  const std::string& value = plan->rows[index].swept;
  if (value.empty()) {
    (*summary)["setting"] = name;
  } else {
    (*summary)["sweep_value"] = value;
  }
  double mean = 0, peak = 0;
  for (double u : result.stage_utilization) mean += u / result.stage_utilization.size();
  for (double b : result.device_peak_bytes) peak = std::max(peak, b);
  std::printf(
      "%-16s %12.1f %12.0f %9.1f%% %10zu %10.2f %12.3f", name.c_str(), result.summary.samples_per_s,
      result.summary.tokens_per_s.value_or(0.0), 100 * mean,
      result.staleness_histogram.empty() ? size_t{0} : result.staleness_histogram.size() - 1,
      peak / 1e9, result.virtual_s);
  if (plan->weak_scaling) print_weak_scaling(result, plan->configs[index], plan, summary);
  if (numerics) {
    std::printf(" %10.4f %12s", result.summary.final_test_accuracy,
                result.summary.time_to_target_s
                    ? std::to_string(*result.summary.time_to_target_s).c_str()
                    : "-");
  }
  std::printf("\n");
}

/// Warns of every device that a run would overfill, naming the run's setting or swept value.
void warn_out_of_memory(const json& runs, const std::string& sweep_key) {
  for (const json& run : runs) {
    for (const json& device : run["peak_memory"]) {
      if (!device["out_of_memory"].get<bool>()) continue;
      const std::string where =
          run.contains("sweep_value")
              ? " with " + sweep_key + "=" + run["sweep_value"].get<std::string>()
          : run.contains("setting") ? " with setting " + run["setting"].get<std::string>()
                                    : "";
      std::fprintf(
          stderr, "troupe simulate: warning: %s would run out of memory (%.2f GB of %.2f GB)%s\n",
          device["device"].get<std::string>().c_str(), device["peak_bytes"].get<double>() / 1e9,
          device["capacity_bytes"].get<double>() / 1e9, where.c_str());
    }
  }
}

/// What every row is simulated with, and where the output goes.
struct simulation_context {
  const simulate_options& options;
  const sim::cluster_model& cluster;
  const sim::simulation_options& settings;
  actors::training_observer& observer;
  std::string out;
};

/// Simulates row `index` and prints it: its line of the table, or the lone run's details; the
/// first run also writes trace.json. Its summary, or nothing with `status` the exit status
/// after saying what failed.
std::optional<json> simulate_row(const simulation_context& context, size_t index, bool first,
                                 simulation_plan* plan, int* status) {
  const simulate_options& options = context.options;
  actors::job_config* config = &plan->configs[index];
  if ((*status = prepare_row(options, *plan, index, config))) return std::nullopt;
  std::string error;
  auto data = actors::load_job_data(*config, &error);
  if (!data) {
    *status = bad_input(error);
    return std::nullopt;
  }
  auto result =
      timed_simulation(*config, *data, context.cluster, context.settings, context.observer, &error);
  if (!result) {
    std::fprintf(stderr, "troupe simulate: %s: %s\n", options.job_file.c_str(), error.c_str());
    *status = 1;
    return std::nullopt;
  }
  json summary = summary_json(*result, options.numerics);
  if (plan->table) {
    print_table_row(*result, index, options.numerics, plan, &summary);
  } else {
    print_details(*result, options.numerics);
  }
  if (first && result->trace &&
      !write_trace_file(*result->trace, context.out + "/trace.json", &error)) {
    *status = bad_input(error);
    return std::nullopt;
  }
  return summary;
}

}  // namespace

int run_simulate(const simulate_options& options) {
  std::string error;
  auto cluster = sim::load_cluster_file(options.cluster_file, &error);
  if (!cluster) return bad_input(error);
  auto settings = simulation_settings(options, &*cluster, &error);
  if (!settings) return bad_input(error);
  simulation_plan plan;
  if (!plan_rows(options, &plan, &error)) return bad_input(error);
  const std::string out = options.out_directory.empty() ? "runs/simulation" : options.out_directory;
  if (!make_directory(out, &error)) return bad_input(error);
  metrics_log log(out + "/metrics.jsonl");
  simulation_observer observer(options.numerics ? &log : nullptr);
  if (const int status = load_row_jobs(options, &plan)) return status;
  if (plan.table) print_table_header(plan, options.numerics);
  const simulation_context context{options, *cluster, *settings, observer, out};
  json runs = json::array();
  for (size_t index = 0; index < plan.rows.size(); ++index) {
    int status = 0;
    auto summary = simulate_row(context, index, runs.empty(), &plan, &status);
    if (!summary) return status;
    runs.push_back(std::move(*summary));
  }
  json summary = runs.front();
  if (plan.table) summary["sweep"] = {{"key", plan.row_heading}, {"runs", runs}};
  if (!write_json_file(out + "/summary.json", summary, &error)) return bad_input(error);
  warn_out_of_memory(runs, plan.sweep_key);
  return 0;
}

}  // namespace troupe::apps
