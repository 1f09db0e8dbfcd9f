#include "apps/partition_choice.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "actors/config/job_file.h"
#include "actors/engine/partition.h"
#include "sim/calibration/block_timing.h"

namespace troupe::apps {
namespace {

/// The cut points parallelism.partition holds in the config.json at `path` when its model and
/// stage count are `config`'s; empty otherwise.
std::string previous_cut_points(const actors::job_config& config, const std::string& path) {
  std::ifstream file(path);
  if (path.empty() || !file) return {};
  const nlohmann::json json = nlohmann::json::parse(file, nullptr, false);
  if (!json.is_object() || !json.contains("parallelism") || !json.contains("model")) return {};
  const nlohmann::json& partition = json["parallelism"].value("partition", nlohmann::json());
  if (json["parallelism"].value("stages", 0) != config.parallelism.stages ||
      json["model"].value("layers", nlohmann::json()) !=
          actors::to_json(config)["model"]["layers"] ||
      !partition.is_array()) {
    return {};
  }
  std::string cuts;
  for (const nlohmann::json& cut : partition) {
    if (!cut.is_number_integer()) return {};
    cuts += (cuts.empty() ? "" : ",") + std::to_string(cut.get<int64_t>());
  }
  return cuts;
}

}  // namespace

std::optional<std::string> choose_partition(actors::job_config* config, const std::string& previous,
                                            std::string* error) {
  std::string mode = config->parallelism.partition;
  std::optional<std::vector<actors::block_cost>> measured;
  if (mode == "measured" && config->parallelism.stages > 1) {
    const std::string cuts = previous_cut_points(*config, previous);
    if (!cuts.empty()) {
      config->parallelism.partition = cuts;
      mode = "measured, as in " + previous;
    } else {
      measured = sim::measure_block_costs(*config, measured_seconds_per_block, stderr, error);
      if (!measured) return std::nullopt;
    }
  } else if (mode != "balanced" && mode != "uniform" && mode != "measured") {
    mode = "cut points";
  }
  auto plan = actors::plan_partition(*config, measured ? &*measured : nullptr, error);
  if (!plan) return std::nullopt;
  if (measured) config->parallelism.partition = actors::cut_points_text(plan->ranges);
  return "partition (" + mode + "): " + actors::describe_plan(*plan);
}

}  // namespace troupe::apps
