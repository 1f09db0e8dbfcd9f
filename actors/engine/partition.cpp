#include "actors/engine/partition.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "actors/config/layer_cuts.h"
#include "actors/engine/graph_program.h"
#include "layers/layer_registry.h"
#include "layers/model.h"

namespace troupe::actors {
namespace {

/// One core's float32 GEMM rate at a key's shapes (about 105 GFLOP/s peak, 75-90 % reached).
constexpr double multiply_adds_per_s = 40e9;
constexpr double bytes_per_s = nominal_bytes_per_s;
/// The CPU time one end of a message costs a stage besides its bytes (about 30 us between the
/// threads of one process, 100 us between processes).
constexpr double message_overhead_s = 30e-6;
/// Bytes an optimizer step moves per parameter (weight, gradient and momentum read, two written).
constexpr double step_bytes_per_parameter = 20;

/// The estimate of block `index` with output `output` for a key of `batch` samples.
block_cost estimate_block(const job_config& config, const layers::layer_spec& spec,
                          const layers::shape& input, const layers::shape& output, double batch) {
  const double elements = static_cast<double>(layers::element_count(output));
  const double parameters = static_cast<double>(layers::parameter_count(spec, input));
  // Multiply-adds per sample: a registered type does one per weight.
  double multiply_adds = parameters;
  if (spec.type == "linear" || spec.type == "conv2d") {
    multiply_adds = parameters / std::max(1, spec.out) * elements;
  } else if (spec.type == "linear_head" || spec.type == "linear_tail") {
    // A part of a cut linear layer: one multiply-add per weight for each row of the sample.
    multiply_adds = parameters * static_cast<double>(layers::element_count(input) / input.back());
  } else if (spec.type == "conv2d_head" || spec.type == "conv2d_tail") {
    // A part of a cut convolution: one multiply-add per weight for each pixel (the image keeps
    // its size).
    multiply_adds = parameters * static_cast<double>(input[1] * input[2]);
  }
  const double gemm_s = batch * multiply_adds / multiply_adds_per_s;
  const double elementwise_s = batch * elements * sizeof(float) / bytes_per_s;
  block_cost cost;
  cost.forward = gemm_s + 2 * elementwise_s;         // read the input, write the output
  cost.backward = gemm_s;                            // the weight gradient: one more GEMM
  cost.input_gradient = gemm_s + 3 * elementwise_s;  // and one for the input's gradient
  cost.step = parameters * step_bytes_per_parameter / bytes_per_s / keys_between_steps(config);
  cost.message = 2 * (message_overhead_s + elementwise_s);  // the activation and its gradient
  return cost;
}

/// Block `index`'s work without messages.
double compute_cost(const std::vector<block_cost>& costs, size_t index) {
  const block_cost& block = costs[index];
  return block.forward + block.backward + block.step +
         (block.input_gradient_needed ? block.input_gradient : 0.0);
}

bool starts_stage_well(const job_config& config, size_t block) {
  const std::string& type = config.model.layers[block].type;
  if (type == "linear" || type == "conv2d" || type == "flatten" || layers::is_cut_tail(type)) {
    return true;
  }
  return layers::find_custom_layer_type(type) != nullptr;
}

/// A graph's nodes as the blocks a partition cuts between: each node's blocks estimated for the
/// rows a key brings it (nominal_parts_per_instance rows per instance where it runs on parts).
std::optional<std::vector<block_cost>> estimated_node_costs(const job_config& config,
                                                            std::string* error) {
  auto graph = ordered_graph_of(config, error);
  if (!graph) return std::nullopt;
  const double instances = static_cast<double>(config.training.batch_size) /
                           std::max(1, config.parallelism.micro_batches);
  std::vector<block_cost> costs;
  bool per_part = true;
  for (size_t n = 0; n < graph->nodes.size(); ++n) {
    const double rows = instances * (per_part ? nominal_parts_per_instance : 1.0);
    layers::shape input = graph->widths[n].blocks_shape();
    block_cost total;
    for (const layers::layer_spec& spec : graph->nodes[n].layers) {
      layers::shape output;
      if (!layers::infer_output_shape(spec, input, &output, error)) return std::nullopt;
      const block_cost cost = estimate_block(config, spec, input, output, rows);
      total.forward += cost.forward;
      total.backward += cost.backward;
      total.input_gradient += cost.input_gradient;
      total.step += cost.step;
      total.message = cost.message;  // the node's output and its gradient
      input = output;
    }
    costs.push_back(total);
    per_part = graph->widths[n].emits_per_part;
  }
  return costs;
}

}  // namespace

std::vector<bool> good_stage_starts(const job_config& config) {
  if (!config.model.nodes.empty()) return std::vector<bool>(config.model.nodes.size(), true);
  std::vector<bool> starts;
  for (size_t i = 0; i < config.model.layers.size(); ++i) {
    starts.push_back(starts_stage_well(config, i));
  }
  return starts;
}

namespace {

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

/// The ranges that `cuts` (stage starts after the first) make of `blocks` blocks; nothing, with
/// `error` set, unless the cuts increase within the model.
std::optional<std::vector<stage_range>> ranges_of(std::vector<size_t> cuts, size_t blocks,
                                                  std::string* error) {
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

}  // namespace

int keys_between_steps(const job_config& config) {
  const parallelism_config& p = config.parallelism;
  return std::max(1, p.min_update_interval > 0 ? p.min_update_interval : p.micro_batches);
}

size_t blocks_without_input_gradient(const job_config& config) {
  // A graph's first node takes token ids, which have no gradient.
  if (!config.model.nodes.empty()) return 1;
  layers::shape input(config.model.input_shape.begin(), config.model.input_shape.end());
  std::string error;
  auto shapes = layers::infer_shapes(config.model.layers, input, &error);
  if (!shapes) return 0;
  for (size_t i = 0; i < shapes->size(); ++i) {
    if (layers::parameter_count(config.model.layers[i], input) > 0) return i + 1;
    input = (*shapes)[i];
  }
  return shapes->size();
}

/// Marks the blocks_without_input_gradient().
void mark_input_gradients(const job_config& config, std::vector<block_cost>* costs) {
  const size_t skipped = std::min(costs->size(), blocks_without_input_gradient(config));
  for (size_t i = 0; i < skipped; ++i) (*costs)[i].input_gradient_needed = false;
}

std::optional<std::vector<block_cost>> estimated_block_costs(const job_config& config,
                                                             std::string* error) {
  if (!config.model.nodes.empty()) return estimated_node_costs(config, error);
  layers::shape input(config.model.input_shape.begin(), config.model.input_shape.end());
  auto shapes = layers::infer_shapes(config.model.layers, input, error);
  if (!shapes) return std::nullopt;
  const double batch = static_cast<double>(config.training.batch_size) /
                       std::max(1, config.parallelism.micro_batches);
  std::vector<block_cost> costs;
  for (size_t i = 0; i < shapes->size(); ++i) {
    costs.push_back(estimate_block(config, config.model.layers[i], input, (*shapes)[i], batch));
    input = (*shapes)[i];
  }
  mark_input_gradients(config, &costs);
  return costs;
}

double stage_cost(const std::vector<block_cost>& costs, stage_range range) {
  double total = 0;
  for (size_t i = range.first; i < range.last; ++i) total += compute_cost(costs, i);
  if (range.first > 0) total += costs[range.first - 1].message;
  if (range.last < costs.size()) total += costs[range.last - 1].message;
  return total;
}

std::vector<stage_range> cheapest_ranges(const std::vector<block_cost>& costs, int stages,
                                         const std::vector<bool>& good_starts) {
  const size_t n = costs.size();
  // prefix[i]: blocks [0, i) without messages, so that a stage's cost takes constant time.
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + compute_cost(costs, i);
  const auto cost_of = [&](size_t first, size_t last) {
    return prefix[last] - prefix[first] + (first > 0 ? costs[first - 1].message : 0.0) +
           (last < n ? costs[last - 1].message : 0.0);
  };
  const double total = prefix[n];
  const double infinity = std::numeric_limits<double>::infinity();
  // best[s][i]: the smallest maximum stage cost splitting blocks [0, i) into s stages.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, infinity));
  std::vector<std::vector<size_t>> from(stages + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= stages; ++s) {
    for (size_t i = s; i <= n; ++i) {
      for (size_t j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == infinity) continue;
        // A boundary in front of a poor stage start costs a little extra, so ties prefer others.
        const bool poor = j > 0 && !good_starts.empty() && !good_starts[j];
        const double cost = std::max(best[s - 1][j], cost_of(j, i)) + (poor ? 1e-9 * total : 0.0);
        if (cost < best[s][i]) {
          best[s][i] = cost;
          from[s][i] = j;
        }
      }
    }
  }
  std::vector<stage_range> ranges;
  for (size_t s = stages, i = n; s > 0; --s) {
    ranges.push_back({from[s][i], i});
    i = from[s][i];
  }
  std::reverse(ranges.begin(), ranges.end());
  return ranges;
}

std::optional<partition_plan> plan_partition(const job_config& config,
                                             const std::vector<block_cost>* measured,
                                             std::string* error) {
  auto estimate = estimated_block_costs(config, error);
  if (!estimate) return std::nullopt;
  const size_t blocks = estimate->size();
  if (measured && measured->size() != blocks) {
    *error = "parallelism.partition: " + std::to_string(measured->size()) +
             " measured block costs for the " + std::to_string(blocks) + " blocks of model.layers";
    return std::nullopt;
  }
  std::vector<block_cost> costs = measured ? *measured : *estimate;
  mark_input_gradients(config, &costs);
  const int stages = config.parallelism.stages;
  if (stages < 1 || static_cast<size_t>(stages) > blocks) {
    *error = "parallelism.stages = " + std::to_string(stages) + " needs between 1 and " +
             std::to_string(blocks) + " stages (one block each at least)";
    return std::nullopt;
  }
  const std::string& mode = config.parallelism.partition;
  partition_plan plan;
  std::vector<size_t> cuts;
  if (mode == "balanced" || mode == "measured") {
    plan.ranges = cheapest_ranges(costs, stages, good_stage_starts(config));
  } else if (mode == "uniform") {
    cuts = uniform_cuts(blocks, stages);
  } else if (!parse_cuts(mode, &cuts) || cuts.size() != static_cast<size_t>(stages - 1)) {
    *error = "parallelism.partition = \"" + mode +
             "\": expected \"balanced\", \"measured\", \"uniform\" or " +
             std::to_string(stages - 1) + " cut points";
    return std::nullopt;
  }
  if (plan.ranges.empty()) {
    auto ranges = ranges_of(cuts, blocks, error);
    if (!ranges) return std::nullopt;
    plan.ranges = std::move(*ranges);
  }
  for (const stage_range& range : plan.ranges) plan.stage_costs.push_back(stage_cost(costs, range));
  return plan;
}

std::optional<std::vector<stage_range>> partition_model(const job_config& config,
                                                        std::string* error) {
  auto plan = plan_partition(config, nullptr, error);
  if (!plan) return std::nullopt;
  return std::move(plan->ranges);
}

std::string cut_points_text(const std::vector<stage_range>& ranges) {
  std::string text;
  for (size_t s = 1; s < ranges.size(); ++s) {
    text += (text.empty() ? "" : ",") + std::to_string(ranges[s].first);
  }
  return text;
}

std::string predicted_shares(const partition_plan& plan) {
  double total = 0;
  for (double cost : plan.stage_costs) total += cost;
  std::string shares;
  for (size_t s = 0; s < plan.stage_costs.size(); ++s) {
    char text[32];
    const double share = total > 0 ? 100 * plan.stage_costs[s] / total : 0;
    std::snprintf(text, sizeof text, "%s%.1f%%", s == 0 ? "" : ", ", share);
    shares += text;
  }
  return shares;
}

double largest_share(const partition_plan& plan) {
  double total = 0, most = 0;
  for (double cost : plan.stage_costs) total += cost, most = std::max(most, cost);
  return total > 0 ? most / total : 0;
}

std::string describe_plan(const job_config& config, const partition_plan& plan) {
  std::string stages;
  if (!config.model.nodes.empty()) {
    // A graph's stages by the nodes they hold, in the order rows visit them: "[embed] [cell head]".
    std::string error;
    auto graph = ordered_graph_of(config, &error);
    for (size_t s = 0; graph && s < plan.ranges.size(); ++s) {
      stages += s == 0 ? "[" : " [";
      for (size_t n = plan.ranges[s].first; n < plan.ranges[s].last; ++n)
        stages += (n == plan.ranges[s].first ? "" : " ") + graph->nodes[n].name;
      stages += "]";
    }
    return "stages " + stages + "; predicted share " + predicted_shares(plan);
  }
  // Stage bounds as the job file numbers its blocks: "4:736" inside a cut linear layer.
  for (size_t s = 0; s < plan.ranges.size(); ++s) {
    stages += (s == 0 ? "[" : " [") + written_bound(config, plan.ranges[s].first) + "," +
              written_bound(config, plan.ranges[s].last) + ")";
  }
  return "stages " + stages + "; predicted share " + predicted_shares(plan);
}

}  // namespace troupe::actors
