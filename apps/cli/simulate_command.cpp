// `troupe simulate JOB --cluster FILE`: the job's pipeline in virtual time on a modelled
// cluster (sim/), with a table on stdout and summary.json / trace.json in the output directory.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/storage/file_system.h"
#include "apps/cli/commands.h"
#include "apps/cli/partition_choice.h"
#include "apps/cli/run_output.h"
#include "apps/cli/sweep_option.h"
#include "sim/calibration/calibrate.h"
#include "sim/profile.h"
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

int device_named(const sim::cluster_model& cluster, const std::string& name) {
  for (size_t d = 0; d < cluster.devices.size(); ++d) {
    if (cluster.devices[d].name == name) return static_cast<int>(d);
  }
  return -1;
}

int link_named(const sim::cluster_model& cluster, const std::string& name) {
  for (size_t l = 0; l < cluster.links.size(); ++l) {
    if (cluster.links[l].name == name) return static_cast<int>(l);
  }
  return -1;
}

bool parse_number(const std::string& text, double* value) {
  std::istringstream in(text);
  return static_cast<bool>(in >> *value) && in.eof();
}

/// "DEVICE=SLOWDOWN" or "DEVICE=SLOWDOWN@PROBABILITY".
bool parse_straggler(const std::string& text, const sim::cluster_model& cluster,
                     sim::straggler* out, std::string* error) {
  const size_t equals = text.rfind('=');
  const size_t at = text.find('@', equals == std::string::npos ? 0 : equals);
  *error = "--straggler " + text + ": ";
  if (equals == std::string::npos) {
    *error += "expected DEVICE=SLOWDOWN[@PROBABILITY]";
    return false;
  }
  out->device = device_named(cluster, text.substr(0, equals));
  if (out->device < 0) {
    *error += "no device named " + text.substr(0, equals) + " in the cluster";
    return false;
  }
  const std::string slowdown =
      text.substr(equals + 1, at == std::string::npos ? at : at - equals - 1);
  if (!parse_number(slowdown, &out->slowdown) || out->slowdown < 1) {
    *error += "the slowdown must be a number >= 1";
    return false;
  }
  out->probability = 1;
  if (at != std::string::npos && (!parse_number(text.substr(at + 1), &out->probability) ||
                                  out->probability <= 0 || out->probability > 1)) {
    *error += "the probability must be in (0, 1]";
    return false;
  }
  return true;
}

/// "LINK=FACTOR@START-END" (seconds of virtual time).
bool parse_degradation(const std::string& text, const sim::cluster_model& cluster,
                       sim::link_degradation* out, std::string* error) {
  const size_t equals = text.rfind('=');
  const size_t at = text.find('@', equals == std::string::npos ? 0 : equals);
  const size_t dash = text.find('-', at == std::string::npos ? 0 : at);
  *error = "--degrade " + text + ": ";
  if (equals == std::string::npos || at == std::string::npos || dash == std::string::npos) {
    *error += "expected LINK=FACTOR@START-END";
    return false;
  }
  out->link = link_named(cluster, text.substr(0, equals));
  if (out->link < 0) {
    *error += "no link named \"" + text.substr(0, equals) + "\" in the cluster";
    return false;
  }
  if (!parse_number(text.substr(equals + 1, at - equals - 1), &out->factor) || out->factor <= 0 ||
      !parse_number(text.substr(at + 1, dash - at - 1), &out->start_s) ||
      !parse_number(text.substr(dash + 1), &out->end_s) || out->start_s < 0 ||
      out->end_s <= out->start_s) {
    *error += "FACTOR must be > 0 and 0 <= START < END";
    return false;
  }
  return true;
}

/// "DEVICE@SECONDS" (virtual time).
bool parse_failure(const std::string& text, const sim::cluster_model& cluster,
                   sim::worker_failure* out, std::string* error) {
  const size_t at = text.rfind('@');
  *error = "--fail " + text + ": ";
  if (at == std::string::npos) {
    *error += "expected DEVICE@SECONDS";
    return false;
  }
  out->device = device_named(cluster, text.substr(0, at));
  if (out->device < 0) {
    *error += "no device named \"" + text.substr(0, at) + "\" in the cluster";
    return false;
  }
  if (!parse_number(text.substr(at + 1), &out->at_s) || !(out->at_s >= 0)) {
    *error += "SECONDS must be a number >= 0";
    return false;
  }
  return true;
}

json summary_json(const sim::simulation_result& result, bool numerics) {
  json summary = {{"samples_per_s", result.summary.samples_per_s},
                  {"virtual_s", result.virtual_s},
                  {"steps", result.summary.steps},
                  {"epochs", result.summary.epochs},
                  {"stage_utilization", result.stage_utilization},
                  {"stage_idle_fraction", result.stage_idle_fraction},
                  {"staleness_histogram", result.staleness_histogram},
                  {"stage_staleness_histograms", result.stage_staleness_histograms},
                  {"checkpoints", result.checkpoints},
                  {"checkpoint_s", result.checkpoint_s},
                  {"restarts", result.restarts},
                  {"recovery_s", result.recovery_s},
                  {"lost_steps", result.lost_steps},
                  {"events", result.events},
                  {"events_per_s", result.events_per_s},
                  {"wall_s", result.wall_s},
                  {"trace_hash", result.trace_hash}};
  json links = json::object();
  for (size_t l = 0; l < result.link_names.size(); ++l) {
    links[result.link_names[l]] = result.link_utilization[l];
  }
  summary["link_utilization"] = links;
  double idle = 0;
  for (double fraction : result.stage_idle_fraction) {
    idle += fraction / static_cast<double>(result.stage_idle_fraction.size());
  }
  summary["bubble"] = idle;  // the mean idle share of the stages
  if (result.summary.tokens_per_s) summary["tokens_per_s"] = *result.summary.tokens_per_s;
  json memory = json::array();
  for (size_t d = 0; d < result.device_names.size(); ++d) {
    memory.push_back(
        {{"device", result.device_names[d]},
         {"peak_bytes", result.device_peak_bytes[d]},
         {"capacity_bytes", result.device_memory_bytes[d]},
         {"out_of_memory", result.device_peak_bytes[d] > result.device_memory_bytes[d]}});
  }
  summary["peak_memory"] = memory;
  if (numerics) {
    summary["final_test_accuracy"] = result.summary.final_test_accuracy;
    summary["final_test_loss"] = result.summary.final_test_loss;
    if (result.summary.bits_per_byte) {
      summary["validation_loss"] = result.summary.final_test_loss;
      summary["bits_per_byte"] = *result.summary.bits_per_byte;
    }
    summary["time_to_target_s"] =
        result.summary.time_to_target_s ? json(*result.summary.time_to_target_s) : json(nullptr);
    summary["steps_to_target"] =
        result.summary.steps_to_target ? json(*result.summary.steps_to_target) : json(nullptr);
  }
  return summary;
}

void print_details(const sim::simulation_result& result, bool numerics) {
  std::printf("%-8s %12s %8s\n", "stage", "utilization", "idle");
  for (size_t s = 0; s < result.stage_utilization.size(); ++s) {
    std::printf("%-8zu %11.1f%% %7.1f%%\n", s, 100 * result.stage_utilization[s],
                100 * result.stage_idle_fraction[s]);
  }
  std::printf("\n%-32s %12s\n", "link", "utilization");
  for (size_t l = 0; l < result.link_names.size(); ++l) {
    std::printf("%-32s %11.1f%%\n", result.link_names[l].c_str(), 100 * result.link_utilization[l]);
  }
  std::printf("\nstaleness (backward passes):");
  for (size_t i = 0; i < result.staleness_histogram.size(); ++i) {
    std::printf(" %zu:%lld", i, static_cast<long long>(result.staleness_histogram[i]));
  }
  std::printf("\n\n%-20s %14s %14s\n", "device", "peak memory", "capacity");
  for (size_t d = 0; d < result.device_names.size(); ++d) {
    const bool over = result.device_peak_bytes[d] > result.device_memory_bytes[d];
    std::printf("%-20s %11.2f GB %11.2f GB%s\n", result.device_names[d].c_str(),
                result.device_peak_bytes[d] / 1e9, result.device_memory_bytes[d] / 1e9,
                over ? "  OUT OF MEMORY" : "");
  }
  if (result.summary.tokens_per_s) std::printf("\ntokens/s %.0f", *result.summary.tokens_per_s);
  std::printf(
      "\nsamples/s %.1f  simulated %.3f s  %lld events in %.2f s (%.0f events/s)  trace %016llx\n",
      result.summary.samples_per_s, result.virtual_s, static_cast<long long>(result.events),
      result.wall_s, result.events_per_s, static_cast<unsigned long long>(result.trace_hash));
  if (result.checkpoints > 0 || result.restarts > 0) {
    std::printf(
        "checkpoints %lld (%.3f s writing)  restarts %lld (%.3f s recovering, %lld steps "
        "redone)\n",
        static_cast<long long>(result.checkpoints), result.checkpoint_s,
        static_cast<long long>(result.restarts), result.recovery_s,
        static_cast<long long>(result.lost_steps));
  }
  if (numerics && result.summary.bits_per_byte) {
    std::printf("validation_loss %.4f  bits_per_byte %.4f\n", result.summary.final_test_loss,
                *result.summary.bits_per_byte);
  }
  if (numerics) {
    const actors::training_summary& summary = result.summary;
    std::string target = "not reached";
    if (summary.time_to_target_s) target = std::to_string(*summary.time_to_target_s) + " s";
    if (summary.steps_to_target)
      target += " (step " + std::to_string(*summary.steps_to_target) + ")";
    std::printf("final_test_accuracy %.4f  time to target %s\n", summary.final_test_accuracy,
                target.c_str());
  }
}

}  // namespace

int run_simulate(const simulate_options& options) {
  std::string error;
  auto cluster = sim::load_cluster_file(options.cluster_file, &error);
  if (!cluster) return bad_input(error);
  sim::simulation_options settings;
  if (!options.profile_file.empty()) {
    settings.profile = sim::load_profile(options.profile_file, &error);
    if (!settings.profile) return bad_input(error);
    sim::use_measured_transport(*settings.profile, &*cluster, /*in_process=*/true);
    settings.message_cpu_s = settings.profile->inproc_message_cpu_s;  // stages of one process
    settings.message_cpu_per_byte_s = settings.profile->inproc_message_cpu_per_byte_s;
  }
  settings.numerics = options.numerics;
  settings.seed = options.seed;
  for (const std::string& text : options.stragglers) {
    settings.stragglers.emplace_back();
    if (!parse_straggler(text, *cluster, &settings.stragglers.back(), &error)) {
      return bad_input(error);
    }
  }
  for (const std::string& text : options.degradations) {
    settings.degradations.emplace_back();
    if (!parse_degradation(text, *cluster, &settings.degradations.back(), &error)) {
      return bad_input(error);
    }
  }
  for (const std::string& text : options.failures) {
    settings.failures.emplace_back();
    if (!parse_failure(text, *cluster, &settings.failures.back(), &error)) return bad_input(error);
  }
  settings.detection_s = options.heartbeat_timeout_s;
  settings.restart_s = options.restart_s;
  // The table's rows: each --setting, then each value of --sweep; the job alone without them.
  std::optional<sweep_option> sweep;
  if (!options.sweep.empty() && !(sweep = parse_sweep(options.sweep, &error))) {
    return bad_input(error);
  }
  const std::string sweep_key = sweep ? sweep->key : "";
  auto rows = parse_settings(options.settings, sweep, &error);
  if (!rows) return bad_input(error);
  const bool table = !rows->empty();
  if (!table) rows->push_back({"", {}, ""});
  const std::string row_heading = options.settings.empty() ? sweep_key : "setting";
  const std::string out = options.out_directory.empty() ? "runs/simulation" : options.out_directory;
  if (!make_directory(out, &error)) return bad_input(error);
  metrics_log log(out + "/metrics.jsonl");
  simulation_observer observer(options.numerics ? &log : nullptr);

  // A sweep over the replicas is a weak-scaling study: each replica keeps the job's batch
  // per replica, so training.batch_size grows with them.
  const bool weak_scaling = options.settings.empty() && sweep_key == "parallelism.replicas";
  int64_t batch_per_replica = 0;
  if (weak_scaling) {
    actors::job_error problem;
    auto base = actors::load_job_file(options.job_file, options.overrides, &problem);
    if (!base) return bad_input(problem.message);
    batch_per_replica = base->training.batch_size / base->parallelism.replicas;
    std::printf("weak scaling: training.batch_size = %lld per replica\n",
                static_cast<long long>(batch_per_replica));
  }
  // Every row's job, read before the table starts, so that a bad setting is one line of
  // error, not a header without rows.
  std::vector<actors::job_config> configs;
  for (const setting& row : *rows) {
    std::vector<std::string> overrides = options.overrides;
    overrides.insert(overrides.end(), row.overrides.begin(), row.overrides.end());
    if (weak_scaling) {
      const int64_t replicas = std::max<int64_t>(1, std::atoll(row.swept.c_str()));
      overrides.push_back("training.batch_size=" + std::to_string(batch_per_replica * replicas));
    }
    actors::job_error problem;
    auto config = actors::load_job_file(options.job_file, overrides, &problem);
    if (!config) return bad_input((table ? "setting " + row.name + ": " : "") + problem.message);
    configs.push_back(std::move(*config));
  }
  json runs = json::array();
  json first;
  if (table) {
    std::printf("%-16s %12s %12s %10s %10s %10s %12s%s%s\n", row_heading.c_str(), "samples/s",
                "tokens/s", "mean util", "max stale", "peak GB", "simulated s",
                weak_scaling ? "   batch  weak eff  busiest link" : "",
                options.numerics ? "   accuracy  to target s" : "");
  }
  double first_rate_per_replica = 0;
  for (size_t index = 0; index < rows->size(); ++index) {
    const std::string& name = (*rows)[index].name;
    const std::string& value = (*rows)[index].swept;
    actors::job_config* config = &configs[index];
    if (!estimate_measured_partition(config, &error)) {
      return bad_input(options.job_file + ": " + error);
    }
    if (!table) {
      const std::string hint = layer_cut_hint(*config);
      if (!hint.empty()) std::fprintf(stderr, "%s\n", hint.c_str());
    }
    if (const std::string note = interleaving_note(*config, table); !note.empty()) {
      std::fprintf(stderr, "%s%s\n", note.c_str(),
                   table ? (" (the row " + name + ")").c_str() : "");
    }
    auto data = actors::load_job_data(*config, &error);
    if (!data) return bad_input(error);
    const auto start = std::chrono::steady_clock::now();
    auto result = sim::simulate(*config, *data, *cluster, settings, observer, &error);
    if (!result) {
      std::fprintf(stderr, "troupe simulate: %s: %s\n", options.job_file.c_str(), error.c_str());
      return 1;
    }
    result->wall_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    result->events_per_s = static_cast<double>(result->events) / std::max(1e-9, result->wall_s);
    json summary = summary_json(*result, options.numerics);
    if (table) {
      if (value.empty()) {
        summary["setting"] = name;
      } else {
        summary["sweep_value"] = value;
      }
      double mean = 0, peak = 0;
      for (double u : result->stage_utilization) mean += u / result->stage_utilization.size();
      for (double b : result->device_peak_bytes) peak = std::max(peak, b);
      std::printf(
          "%-16s %12.1f %12.0f %9.1f%% %10zu %10.2f %12.3f", name.c_str(),
          result->summary.samples_per_s, result->summary.tokens_per_s.value_or(0.0), 100 * mean,
          result->staleness_histogram.empty() ? size_t{0} : result->staleness_histogram.size() - 1,
          peak / 1e9, result->virtual_s);
      if (weak_scaling) {
        const double per_replica =
            result->summary.samples_per_s / std::max(1, config->parallelism.replicas);
        if (first_rate_per_replica == 0) first_rate_per_replica = per_replica;
        const double efficiency = per_replica / std::max(1e-12, first_rate_per_replica);
        double busiest = 0;
        std::string link = "-";
        for (size_t i = 0; i < result->link_utilization.size(); ++i) {
          if (result->link_utilization[i] > busiest) {
            busiest = result->link_utilization[i];
            link = result->link_names[i];
          }
        }
        summary["weak_scaling_efficiency"] = efficiency;
        summary["busiest_link"] = {{"link", link}, {"utilization", busiest}};
        std::printf(" %7lld %8.1f%%  %s %.0f%%",
                    static_cast<long long>(config->training.batch_size), 100 * efficiency,
                    link.c_str(), 100 * busiest);
      }
      if (options.numerics) {
        std::printf(" %10.4f %12s", result->summary.final_test_accuracy,
                    result->summary.time_to_target_s
                        ? std::to_string(*result->summary.time_to_target_s).c_str()
                        : "-");
      }
      std::printf("\n");
    } else {
      print_details(*result, options.numerics);
    }
    if (first.is_null()) {
      first = summary;
      if (result->trace && !write_trace_file(*result->trace, out + "/trace.json", &error)) {
        return bad_input(error);
      }
    }
    runs.push_back(summary);
  }
  json summary = first;
  if (table) summary["sweep"] = {{"key", row_heading}, {"runs", runs}};
  if (!write_json_file(out + "/summary.json", summary, &error)) return bad_input(error);
  for (const json& run : runs) {
    for (const json& device : run["peak_memory"]) {
      if (device["out_of_memory"].get<bool>()) {
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
  return 0;
}

int run_calibrate(const calibrate_options& options) {
  actors::job_error problem;
  auto config = actors::load_job_file(options.job_file, options.overrides, &problem);
  if (!config) return bad_input(problem.message);
  std::string error;
  auto profile = sim::calibrate(*config, options.seconds, &error);
  if (!profile) {
    std::fprintf(stderr, "troupe calibrate: %s: %s\n", options.job_file.c_str(), error.c_str());
    return 1;
  }
  std::printf("%-6s %-10s %12s %12s %12s %12s\n", "block", "type", "forward ms", "backward ms",
              "first bw ms", "step ms");
  for (size_t b = 0; b < profile->blocks.size(); ++b) {
    const sim::block_profile& block = profile->blocks[b];
    std::printf("%-6zu %-10s %12.4f %12.4f %12.4f %12.4f\n", b, block.type.c_str(),
                1e3 * block.forward_s, 1e3 * block.backward_s, 1e3 * block.backward_first_s,
                1e3 * block.step_s);
  }
  std::printf("loss %.4f ms; %lld samples per key, %d thread(s) per stage on %s\n",
              1e3 * profile->loss_s, static_cast<long long>(profile->batch), profile->threads,
              profile->backend.c_str());
  std::printf("ipc:// message: latency %.1f us, bandwidth %.2f GB/s\n",
              1e6 * profile->link_latency_s, profile->link_bandwidth / 1e9);
  std::printf("CPU per message end: %.1f us between threads, %.1f us between processes\n",
              1e6 * profile->inproc_message_cpu_s, 1e6 * profile->ipc_message_cpu_s);
  std::printf("inproc:// message between threads: latency %.1f us\n",
              1e6 * profile->inproc_latency_s);
  if (!actors::posix_files().write_atomically(options.out_file, sim::to_json_text(*profile),
                                              &error))
    return bad_input(error);
  return 0;
}

}  // namespace troupe::apps
