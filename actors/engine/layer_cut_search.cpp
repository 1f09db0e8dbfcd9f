#include "actors/engine/layer_cut_search.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "actors/config/layer_cuts.h"
#include "layers/model.h"

namespace troupe::actors {
namespace {

/// Outputs a cut inside a layer falls on a multiple of (whole SIMD rows of the weights).
constexpr int row_multiple = 16;
/// Cuts inside layers are kept when they lower the most costly stage by more than this share.
constexpr double least_gain = 0.01;
/// Stage boundaries tried at most (stages × places²); rows lie further apart beyond it.
constexpr double max_pairs_searched = 2e7;

/// What one cuttable layer is: features (channels) in, outputs (channels), rows of a sample
/// (tokens; a convolution's pixels), samples per key, and the outputs between two cuts tried.
struct layer_shape {
  double inputs = 0;
  double outputs = 0;
  double rows_per_sample = 1;
  double batch = 1;
  int step = row_multiple;
  /// A convolution's unfolding of its input (im2col, and col2im for the input gradient) per
  /// key: each part repeats it whole.
  double unfold_s = 0;
};

/// Per block of `config`'s model, its shape when it is a layer that may be cut: a linear layer,
/// or a convolution that keeps its image's size (actors/config/layer_cuts.h).
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
                              rows, batch, row_multiple};
    }
    const bool same_size = std::max(spec.stride, 1) == 1 && 2 * spec.padding + 1 == spec.kernel;
    if (spec.type == "conv2d" && same_size && spec.out >= 2 && input.size() == 3) {
      // Channels one at a time up to 64 of them, then a 64th of them.
      const double unfolded = static_cast<double>(layers::element_count(input)) * spec.kernel *
                              spec.kernel;  // floats per sample
      result[i] = layer_shape{static_cast<double>(input[0]),
                              static_cast<double>(spec.out),
                              static_cast<double>(input[1] * input[2]),
                              batch,
                              std::max(1, spec.out / 64),
                              batch * unfolded * 2 * sizeof(float) / nominal_bytes_per_s};
    }
    input = (*shapes)[i];
  }
  return result;
}

/// The head's and tail's costs of `whole` cut at output `row`: they share its GEMMs and its step
/// in proportion to their outputs, each pays its copies of what it passes on, and the head's
/// message is as wide as its output (the layer's input beside its rows).
std::pair<block_cost, block_cost> cut_costs(const block_cost& whole, const layer_shape& layer,
                                            int row) {
  const double head_share = row / layer.outputs;
  const double tail_share = 1 - head_share;
  // Seconds to copy `floats` per row of a sample in and out once.
  const auto copy = [&layer](double floats) {
    return layer.batch * layer.rows_per_sample * floats * 2 * sizeof(float) / nominal_bytes_per_s;
  };
  block_cost head;
  // A convolution's parts each unfold the whole input, where the layer's cost holds it once.
  head.forward =
      whole.forward * head_share + copy(layer.inputs + row) + layer.unfold_s * tail_share;
  head.backward = whole.backward * head_share;
  head.input_gradient =
      whole.input_gradient * head_share + copy(layer.inputs + row) + layer.unfold_s * tail_share;
  head.step = whole.step * head_share;
  head.message = whole.message * (layer.inputs + row) / layer.outputs;
  head.input_gradient_needed = whole.input_gradient_needed;
  block_cost tail;
  tail.forward = whole.forward * tail_share + copy(layer.outputs) + copy(layer.inputs) +
                 layer.unfold_s * head_share;
  tail.backward = whole.backward * tail_share;
  tail.input_gradient =
      whole.input_gradient * tail_share + copy(layer.inputs + row) + layer.unfold_s * head_share;
  tail.step = whole.step * tail_share;
  tail.message = whole.message;
  tail.input_gradient_needed = true;  // the head's rows of the gradient go back through it
  return {head, tail};
}

/// A place where a stage may begin: block `block`'s start (row 0), or inside that linear layer
/// at output `row`; with its head's and tail's costs there.
struct position {
  size_t block = 0;
  int row = 0;
  block_cost head, tail;
};

/// Work of `cost` without its messages (the input gradient where the engine computes one).
double work_of(const block_cost& cost) {
  return cost.forward + cost.backward + cost.step +
         (cost.input_gradient_needed ? cost.input_gradient : 0.0);
}

/// The positions of `costs`' blocks, the rows inside cuttable layers `coarser` times their
/// steps apart, and the end.
std::vector<position> positions_of(const std::vector<block_cost>& costs,
                                   const std::vector<std::optional<layer_shape>>& cuttable,
                                   int coarser) {
  std::vector<position> result;
  for (size_t b = 0; b <= costs.size(); ++b) {
    result.push_back({b, 0, {}, {}});
    if (b == costs.size() || !cuttable[b]) continue;
    const int step = cuttable[b]->step * coarser;
    for (int row = step; row < static_cast<int>(cuttable[b]->outputs); row += step) {
      auto [head, tail] = cut_costs(costs[b], *cuttable[b], row);
      result.push_back({b, row, head, tail});
    }
  }
  return result;
}

}  // namespace

std::string cheapest_cut_points(const job_config& config, const std::vector<block_cost>& costs) {
  const int stages = config.parallelism.stages;
  const std::vector<std::optional<layer_shape>> cuttable = cuttable_layers(config);
  const size_t n = costs.size();
  if (cuttable.size() != n || stages < 2 || static_cast<size_t>(stages) > n) return {};
  std::vector<block_cost> marked = costs;
  const size_t skipped = std::min(n, blocks_without_input_gradient(config));
  for (size_t i = 0; i < n; ++i) marked[i].input_gradient_needed = i >= skipped;
  const std::vector<bool> starts = good_stage_starts(config);
  std::vector<double> prefix(n + 1, 0.0);  // whole blocks [0, i) without messages
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + work_of(marked[i]);
  // Each layer's step apart, coarser where the dynamic programme would take too long.
  int coarser = 1;
  std::vector<position> places = positions_of(marked, cuttable, coarser);
  while (static_cast<double>(stages) * places.size() * places.size() > max_pairs_searched &&
         coarser < (1 << 20)) {
    coarser *= 2;
    places = positions_of(marked, cuttable, coarser);
  }
  const double total = prefix[n];
  // The cost of a stage from place a to place b (a < b); infinite where both cut one layer.
  const double infinity = std::numeric_limits<double>::infinity();
  const auto stage_of = [&](const position& a, const position& b) {
    if (a.row > 0 && b.row > 0 && a.block == b.block) return infinity;
    const size_t first = a.block + (a.row > 0 ? 1 : 0);
    double cost = prefix[b.block] - prefix[first];
    if (a.row > 0) cost += work_of(a.tail) + a.head.message;
    if (b.row > 0) cost += work_of(b.head) + b.head.message;
    if (a.row == 0 && a.block > 0) cost += marked[a.block - 1].message;
    if (b.row == 0 && b.block < n) cost += marked[b.block - 1].message;
    // Ties prefer stages that begin at a good start (as cheapest_ranges does).
    if (a.row == 0 && a.block > 0 && !starts[a.block]) cost += 1e-9 * total;
    return cost;
  };
  const size_t count = places.size();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(count, infinity));
  std::vector<std::vector<size_t>> from(stages + 1, std::vector<size_t>(count, 0));
  best[0][0] = 0.0;
  for (int s = 1; s <= stages; ++s) {
    for (size_t j = 1; j < count; ++j) {
      for (size_t i = 0; i < j; ++i) {
        if (best[s - 1][i] == infinity) continue;
        const double cost = std::max(best[s - 1][i], stage_of(places[i], places[j]));
        if (cost < best[s][j]) {
          best[s][j] = cost;
          from[s][j] = i;
        }
      }
    }
  }
  std::vector<cut_point> cuts;
  for (size_t s = stages, j = count - 1; s > 1; --s) {
    j = from[s][j];
    cuts.push_back({static_cast<int64_t>(places[j].block), places[j].row});
  }
  std::reverse(cuts.begin(), cuts.end());
  // Whole blocks unless cutting inside layers gains more than least_gain.
  const std::vector<stage_range> whole = cheapest_ranges(marked, stages, starts);
  double whole_most = 0;
  for (const stage_range& range : whole)
    whole_most = std::max(whole_most, stage_cost(marked, range));
  const bool inside =
      std::any_of(cuts.begin(), cuts.end(), [](const cut_point& c) { return c.row; });
  if (!inside || best[stages][count - 1] >= whole_most * (1 - least_gain)) {
    cuts.clear();
    for (size_t s = 1; s < whole.size(); ++s)
      cuts.push_back({static_cast<int64_t>(whole[s].first), 0});
  }
  return cut_points_text(cuts);
}

std::vector<block_cost> joined_cut_costs(const job_config& config,
                                         const std::vector<block_cost>& costs) {
  std::vector<block_cost> joined;
  const std::vector<layers::layer_spec>& blocks = config.model.layers;
  for (size_t i = 0; i < costs.size() && i < blocks.size(); ++i) {
    if (!layers::is_cut_tail(blocks[i].type) || joined.empty()) {
      joined.push_back(costs[i]);
      continue;
    }
    block_cost& layer = joined.back();  // the head
    layer.forward += costs[i].forward;
    layer.backward += costs[i].backward;
    layer.input_gradient += costs[i].input_gradient;
    layer.step += costs[i].step;
    layer.message = costs[i].message;  // the layer's output leaves from the tail
  }
  return joined;
}

}  // namespace troupe::actors
