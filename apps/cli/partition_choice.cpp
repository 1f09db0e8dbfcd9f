#include "apps/cli/partition_choice.h"

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "actors/config/job_file.h"
#include "actors/config/json_text.h"
#include "actors/config/layer_cuts.h"
#include "actors/engine/layer_cut_search.h"
#include "actors/engine/partition.h"
#include "actors/storage/file_system.h"
#include "sim/calibration/block_timing.h"

namespace troupe::apps {
namespace {

/// The cut points parallelism.partition holds in the config.json at `path` when its model and
/// stage count are `config`'s; empty otherwise.
std::string previous_cut_points(const actors::job_config& config, const std::string& path) {
  std::string ignored;
  const std::optional<std::string> text =
      path.empty() ? std::nullopt : actors::posix_files().read(path, &ignored);
  if (!text) return {};
  const nlohmann::json json = actors::parse_json_text(*text, &ignored).value_or(nlohmann::json());
  if (!json.is_object() || !json.contains("parallelism") || !json.contains("model")) return {};
  const nlohmann::json& partition = json["parallelism"].value("partition", nlohmann::json());
  const char* model = config.model.nodes.empty() ? "layers" : "nodes";
  if (json["parallelism"].value("stages", 0) != config.parallelism.stages ||
      json["model"].value(model, nlohmann::json()) != actors::to_json(config)["model"][model] ||
      !partition.is_array()) {
    return {};
  }
  std::string cuts;
  for (const nlohmann::json& cut : partition) {
    // A block index, or "4:736" for a cut inside a linear layer.
    if (!cut.is_number_integer() && !cut.is_string()) return {};
    cuts += (cuts.empty() ? "" : ",") +
            (cut.is_string() ? cut.get<std::string>() : std::to_string(cut.get<int64_t>()));
  }
  std::vector<actors::cut_point> parsed;
  return actors::parse_cut_points(cuts, &parsed) ? cuts : std::string();
}

/// Sets `config`'s partition to the cut points `text` (as a job file spells them), cutting the
/// layers they cut inside.
bool set_cut_points(actors::job_config* config, const std::string& text, std::string* error) {
  config->parallelism.partition = text;
  *error = actors::expand_cut_points(config);
  return error->empty();
}

/// A job whose partition cuts inside layers, its plan, and the plan of whole blocks under the
/// same timing; no plans where cutting whole blocks was as good.
struct layer_cut {
  actors::job_config config;
  std::optional<actors::partition_plan> plan;
  std::optional<actors::partition_plan> whole;
};

/// Cuts inside layers where they make the most costly stage of the whole-block partition in
/// `config` (chosen by `measured`) cheaper, checked by timing the cut model's blocks: the cuts
/// against the same whole blocks under that one timing, each cut layer costing what its parts
/// did, so that the machine's load between the two timings cannot decide.
std::optional<layer_cut> cut_inside_layers(const actors::job_config& config,
                                           const std::vector<actors::block_cost>& measured,
                                           std::string* error) {
  layer_cut result{config, std::nullopt, std::nullopt};
  const std::string cuts = actors::cheapest_cut_points(config, measured);
  if (cuts.find(':') == std::string::npos) return result;
  actors::job_config cut = config;
  if (!set_cut_points(&cut, cuts, error)) return std::nullopt;
  auto timed = sim::measure_block_costs(cut, measured_seconds_per_block, stderr, error);
  if (!timed) return std::nullopt;
  auto plan = actors::plan_partition(cut, &*timed, error);
  if (!plan) return std::nullopt;
  const std::vector<actors::block_cost> joined = actors::joined_cut_costs(cut, *timed);
  auto whole = actors::plan_partition(config, &joined, error);
  if (!whole) return std::nullopt;
  if (actors::largest_share(*plan) < actors::largest_share(*whole)) {
    result.config = std::move(cut);
    result.plan = std::move(plan);
    result.whole = std::move(whole);
  }
  return result;
}

}  // namespace

std::string layer_cut_hint(const actors::job_config& config) {
  if (config.parallelism.partition != "balanced" || config.parallelism.stages < 2) return "";
  std::string ignored;
  const auto costs = actors::estimated_block_costs(config, &ignored);
  const auto whole = costs ? actors::plan_partition(config, &*costs, &ignored) : std::nullopt;
  if (!whole) return "";
  const std::string text = actors::cheapest_cut_points(config, *costs);
  actors::job_config cut = config;
  if (text.find(':') == std::string::npos || !set_cut_points(&cut, text, &ignored)) return "";
  const auto cut_costs = actors::estimated_block_costs(cut, &ignored);
  const auto plan = cut_costs ? actors::plan_partition(cut, &*cut_costs, &ignored) : std::nullopt;
  if (!plan || actors::largest_share(*plan) > actors::largest_share(*whole) - 0.05) return "";
  // As the job file writes them: block indices, and "4:688" inside a layer.
  const nlohmann::json written = actors::to_json(actors::written_job(cut));
  std::string cuts;
  for (const nlohmann::json& point : written["parallelism"]["partition"]) {
    cuts += (cuts.empty() ? "" : ", ") + point.dump();
  }
  char shares[64];
  std::snprintf(shares, sizeof shares, "%.1f%% to %.1f%%", 100 * actors::largest_share(*whole),
                100 * actors::largest_share(*plan));
  return "troupe: cutting inside layers would lower the largest stage's predicted share from " +
         std::string(shares) + ": parallelism.partition = [" + cuts +
         "] (or \"measured\", which times the blocks)";
}

std::string interleaving_note(const actors::job_config& config, bool in_table) {
  const actors::parallelism_config& p = config.parallelism;
  const bool interleaved =
      p.mode == actors::pipeline_mode::sync && p.schedule == actors::pipeline_schedule::interleaved;
  if (!interleaved) return "";
  if (p.virtual_stages == 1) {
    return "troupe: schedule \"interleaved\" with parallelism.virtual_stages = 1 runs as 1F1B; "
           "set virtual_stages >= 2 (stages a multiple of it) to interleave";
  }
  if (!in_table) return "";
  const int workers = p.stages / p.virtual_stages;
  return "troupe: interleaved runs the " + std::to_string(p.stages) + " stages as " +
         std::to_string(p.virtual_stages) + " chunks on " +
         (workers == 1 ? "one worker (device)"
                       : "each of " + std::to_string(workers) + " workers (devices)") +
         "; other schedules give each stage a worker of its own";
}

bool estimate_measured_partition(actors::job_config* config, std::string* error) {
  if (config->parallelism.partition != "measured" || config->parallelism.stages < 2) return true;
  if (!config->model.nodes.empty()) {
    // A graph's nodes, cut where their estimated costs balance.
    auto plan = actors::plan_partition(*config, nullptr, error);
    return plan && set_cut_points(config, actors::cut_points_text(plan->ranges), error);
  }
  auto costs = actors::estimated_block_costs(*config, error);
  if (!costs) return false;
  return set_cut_points(config, actors::cheapest_cut_points(*config, *costs), error);
}

std::optional<std::string> choose_partition(actors::job_config* config, const std::string& previous,
                                            std::string* error) {
  std::string mode = config->parallelism.partition;
  std::optional<std::vector<actors::block_cost>> measured;
  const bool graph = !config->model.nodes.empty();
  if (mode == "measured" && config->parallelism.stages > 1) {
    const std::string cuts = previous_cut_points(*config, previous);
    if (!cuts.empty()) {
      mode = "measured, as in " + previous;
      if (!set_cut_points(config, cuts, error)) return std::nullopt;
    } else {
      measured = sim::measure_block_costs(*config, measured_seconds_per_block, stderr, error);
      if (!measured) return std::nullopt;
    }
  } else if (mode != "balanced" && mode != "uniform" && mode != "measured") {
    mode = "cut points";
  }
  auto plan = actors::plan_partition(*config, measured ? &*measured : nullptr, error);
  if (!plan) return std::nullopt;
  std::string whole_blocks;
  if (measured) {
    config->parallelism.partition = actors::cut_points_text(plan->ranges);
    // A graph is cut between nodes only: its nodes' visits were timed per key.
    if (graph) return "partition (" + mode + "): " + actors::describe_plan(*config, *plan);
    auto cut = cut_inside_layers(*config, *measured, error);
    if (!cut) return std::nullopt;
    if (cut->plan) {
      whole_blocks = " (whole blocks: " + actors::predicted_shares(*cut->whole) + ")";
      *config = std::move(cut->config);
      plan = std::move(cut->plan);
    }
  }
  return "partition (" + mode + "): " + actors::describe_plan(*config, *plan) + whole_blocks;
}

}  // namespace troupe::apps
