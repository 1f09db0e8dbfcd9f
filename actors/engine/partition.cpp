#include "actors/engine/partition.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "layers/layer_registry.h"
#include "layers/model.h"

namespace troupe::actors {
namespace {

/// Forward multiply-adds of each block for one sample (a small floor keeps cheap blocks from
/// counting as free, so the balance also spreads them).
std::vector<double> block_costs(const job_config& config,
                                const std::vector<layers::shape>& shapes) {
  std::vector<double> costs;
  layers::shape input(config.model.input_shape.begin(), config.model.input_shape.end());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& spec = config.model.layers[i];
    double cost = static_cast<double>(layers::element_count(shapes[i]));
    const double parameters = static_cast<double>(layers::parameter_count(spec, input));
    if (spec.type == "linear" || spec.type == "conv2d") {
      const double per_output = parameters / std::max(1, spec.out);
      cost += per_output * static_cast<double>(layers::element_count(shapes[i]));
    } else {
      cost += parameters;  // a registered type: one multiply-add per weight and sample
    }
    costs.push_back(cost);
    input = shapes[i];
  }
  return costs;
}

bool starts_stage_well(const job_config& config, size_t block) {
  const std::string& type = config.model.layers[block].type;
  if (type == "linear" || type == "conv2d" || type == "flatten") return true;
  return layers::find_custom_layer_type(type) != nullptr;
}

/// Cut points that minimize the largest stage cost (exact dynamic programming over blocks),
/// preferring cuts in front of parameterized blocks.
std::vector<size_t> balanced_cuts(const job_config& config, const std::vector<double>& costs,
                                  int stages) {
  const size_t n = costs.size();
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double infinity = std::numeric_limits<double>::infinity();
  // best[s][i]: the smallest maximum stage cost splitting blocks [0, i) into s stages.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, infinity));
  std::vector<std::vector<size_t>> from(stages + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= stages; ++s) {
    for (size_t i = s; i <= n; ++i) {
      for (size_t j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == infinity) continue;
        // A cut in front of a parameterless block costs a little extra, so ties prefer others.
        const double penalty = (j > 0 && !starts_stage_well(config, j)) ? 1e-9 * prefix[n] : 0.0;
        const double cost = std::max(best[s - 1][j], prefix[i] - prefix[j]) + penalty;
        if (cost < best[s][i]) {
          best[s][i] = cost;
          from[s][i] = j;
        }
      }
    }
  }
  std::vector<size_t> cuts;
  for (size_t s = stages, i = n; s > 1; --s) {
    i = from[s][i];
    cuts.push_back(i);
  }
  std::reverse(cuts.begin(), cuts.end());
  return cuts;
}

std::vector<size_t> uniform_cuts(size_t blocks, int stages) {
  std::vector<size_t> cuts;
  for (int s = 1; s < stages; ++s) cuts.push_back(blocks * s / stages);
  return cuts;
}

bool parse_cuts(const std::string& text, std::vector<size_t>* cuts) {
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) {
    char* end = nullptr;
    const long value = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || value < 0) return false;
    cuts->push_back(static_cast<size_t>(value));
  }
  return true;
}

}  // namespace

std::optional<std::vector<stage_range>> partition_model(const job_config& config,
                                                        std::string* error) {
  layers::shape input(config.model.input_shape.begin(), config.model.input_shape.end());
  auto shapes = layers::infer_shapes(config.model.layers, input, error);
  if (!shapes) return std::nullopt;
  const size_t blocks = shapes->size();
  const int stages = config.parallelism.stages;
  if (stages < 1 || static_cast<size_t>(stages) > blocks) {
    *error = "parallelism.stages = " + std::to_string(stages) + " needs between 1 and " +
             std::to_string(blocks) + " stages (one block each at least)";
    return std::nullopt;
  }
  const std::string& mode = config.parallelism.partition;
  std::vector<size_t> cuts;
  if (mode == "uniform") {
    cuts = uniform_cuts(blocks, stages);
  } else if (mode == "balanced") {
    cuts = balanced_cuts(config, block_costs(config, *shapes), stages);
  } else if (!parse_cuts(mode, &cuts) || cuts.size() != static_cast<size_t>(stages - 1)) {
    *error = "parallelism.partition = \"" + mode + "\": expected \"balanced\", \"uniform\" or " +
             std::to_string(stages - 1) + " cut points";
    return std::nullopt;
  }
  std::vector<stage_range> ranges;
  size_t first = 0;
  cuts.push_back(blocks);
  for (size_t cut : cuts) {
    if (cut <= first || cut > blocks) {
      *error = "parallelism.partition: cut points must increase within [1, " +
               std::to_string(blocks - 1) + "]";
      return std::nullopt;
    }
    ranges.push_back({first, cut});
    first = cut;
  }
  return ranges;
}

}  // namespace troupe::actors
