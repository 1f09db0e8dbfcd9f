#include "actors/engine/layer_cut_search.h"

#include <algorithm>
#include <optional>

#include "actors/config/layer_cuts.h"
#include "layers/model.h"

namespace troupe::actors {
namespace {

/// Outputs a cut inside a layer falls on a multiple of (whole SIMD rows of the weights).
constexpr int row_multiple = 16;
/// A cut inside a layer is kept when it lowers the most costly stage by more than this share.
constexpr double least_gain = 0.01;

/// What one cut linear layer is: features in, outputs, rows of a sample, samples per key.
struct layer_shape {
  double inputs = 0;
  double outputs = 0;
  double rows_per_sample = 1;
  double batch = 1;
};

/// Per block of `config`'s model, its shape when it is a linear layer that may be cut.
std::vector<std::optional<layer_shape>> cuttable_layers(const job_config& config) {
  layers::shape input(config.model.input_shape.begin(), config.model.input_shape.end());
  std::string error;
  auto shapes = layers::infer_shapes(config.model.layers, input, &error);
  std::vector<std::optional<layer_shape>> result(config.model.layers.size());
  if (!shapes) return result;
  const double batch = static_cast<double>(config.training.batch_size) /
                       std::max(1, config.parallelism.micro_batches);
  for (size_t i = 0; i < shapes->size(); ++i) {
    const layers::layer_spec& spec = config.model.layers[i];
    if (spec.type == "linear" && spec.out >= 2 * row_multiple && !input.empty()) {
      const double rows = static_cast<double>(layers::element_count(input) / input.back());
      result[i] = layer_shape{static_cast<double>(input.back()), static_cast<double>(spec.out),
                              rows, batch};
    }
    input = (*shapes)[i];
  }
  return result;
}

/// The head's and tail's costs of `whole` cut at output `row` (see costs_with_layer_cut()).
std::pair<block_cost, block_cost> cut_costs(const block_cost& whole, const layer_shape& layer,
                                            int row) {
  const double head_share = row / layer.outputs;
  const double tail_share = 1 - head_share;
  // Seconds to copy `floats` per row of a sample in and out once.
  const auto copy = [&layer](double floats) {
    return layer.batch * layer.rows_per_sample * floats * 2 * sizeof(float) / nominal_bytes_per_s;
  };
  block_cost head;
  head.forward = whole.forward * head_share + copy(layer.inputs + row);
  head.backward = whole.backward * head_share;
  head.input_gradient = whole.input_gradient * head_share + copy(layer.inputs + row);
  head.step = whole.step * head_share;
  head.message = whole.message * (layer.inputs + row) / layer.outputs;
  head.input_gradient_needed = whole.input_gradient_needed;
  block_cost tail;
  tail.forward = whole.forward * tail_share + copy(layer.outputs);
  tail.backward = whole.backward * tail_share;
  tail.input_gradient = whole.input_gradient * tail_share + copy(layer.inputs + row);
  tail.step = whole.step * tail_share;
  tail.message = whole.message;
  tail.input_gradient_needed = true;  // the head's rows of the gradient go back through it
  return {head, tail};
}

double costliest(const std::vector<block_cost>& costs, const std::vector<stage_range>& ranges) {
  double most = 0;
  for (const stage_range& range : ranges) most = std::max(most, stage_cost(costs, range));
  return most;
}

/// The blocks being searched: their costs, good starts, and where each came from.
struct cut_model {
  std::vector<block_cost> costs;
  std::vector<bool> starts;
  std::vector<cut_point> origin;  ///< a tail's cut; other blocks' written index, row 0
  std::vector<std::optional<layer_shape>> cuttable;

  cut_model with_cut(size_t block, int row) const {
    cut_model cut = *this;
    auto [head, tail] = cut_costs(costs[block], *cuttable[block], row);
    cut.costs[block] = head;
    cut.costs.insert(cut.costs.begin() + static_cast<std::ptrdiff_t>(block) + 1, tail);
    cut.starts.insert(cut.starts.begin() + static_cast<std::ptrdiff_t>(block) + 1, true);
    cut.origin.insert(cut.origin.begin() + static_cast<std::ptrdiff_t>(block) + 1,
                      cut_point{origin[block].block, row});
    cut.cuttable[block].reset();
    cut.cuttable.insert(cut.cuttable.begin() + static_cast<std::ptrdiff_t>(block) + 1,
                        std::nullopt);
    return cut;
  }
};

}  // namespace

std::vector<block_cost> costs_with_layer_cut(const job_config& config,
                                             const std::vector<block_cost>& costs, size_t block,
                                             int row) {
  const auto cuttable = cuttable_layers(config);
  std::vector<block_cost> result = costs;
  if (block >= costs.size() || block >= cuttable.size() || !cuttable[block]) return result;
  auto [head, tail] = cut_costs(costs[block], *cuttable[block], row);
  result[block] = head;
  result.insert(result.begin() + static_cast<std::ptrdiff_t>(block) + 1, tail);
  return result;
}

std::string cheapest_cut_points(const job_config& config, const std::vector<block_cost>& costs) {
  const int stages = config.parallelism.stages;
  cut_model model{costs, good_stage_starts(config), {}, cuttable_layers(config)};
  if (model.costs.size() != model.cuttable.size() || stages < 2) return {};
  const size_t skipped = std::min(costs.size(), blocks_without_input_gradient(config));
  for (size_t i = 0; i < model.costs.size(); ++i) {
    model.costs[i].input_gradient_needed = i >= skipped;
    model.origin.push_back(cut_point{static_cast<int64_t>(i), 0});
  }
  std::vector<stage_range> ranges = cheapest_ranges(model.costs, stages, model.starts);
  for (int round = 1; round < stages; ++round) {
    const double most = costliest(model.costs, ranges);
    // Only a cut in or beside the most costly stage can make it cheaper.
    size_t slowest = 0;
    for (size_t s = 0; s < ranges.size(); ++s) {
      if (stage_cost(model.costs, ranges[s]) >= most) slowest = s;
    }
    const size_t first = ranges[slowest].first > 0 ? ranges[slowest].first - 1 : 0;
    const size_t last = std::min(ranges[slowest].last + 1, model.costs.size());
    double best = most * (1 - least_gain);
    std::optional<cut_model> chosen;
    std::vector<stage_range> chosen_ranges;
    for (size_t block = first; block < last; ++block) {
      if (!model.cuttable[block]) continue;
      const int outputs = static_cast<int>(model.cuttable[block]->outputs);
      for (int row = row_multiple; row < outputs; row += row_multiple) {
        cut_model cut = model.with_cut(block, row);
        std::vector<stage_range> cut_ranges = cheapest_ranges(cut.costs, stages, cut.starts);
        const bool cut_there =
            std::any_of(cut_ranges.begin(), cut_ranges.end(),
                        [&](const stage_range& r) { return r.first == block + 1; });
        const double cost = costliest(cut.costs, cut_ranges);
        if (cut_there && cost < best) {
          best = cost;
          chosen = std::move(cut);
          chosen_ranges = std::move(cut_ranges);
        }
      }
    }
    if (!chosen) break;
    model = std::move(*chosen);
    ranges = std::move(chosen_ranges);
  }
  std::vector<cut_point> cuts;
  for (size_t s = 1; s < ranges.size(); ++s) cuts.push_back(model.origin[ranges[s].first]);
  return cut_points_text(cuts);
}

}  // namespace troupe::actors
