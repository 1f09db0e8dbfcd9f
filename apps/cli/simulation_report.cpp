#include "apps/cli/simulation_report.h"

#include <cstdio>
#include <string>

namespace troupe::apps {

namespace {
using json = nlohmann::json;
}  // namespace

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

}  // namespace troupe::apps
