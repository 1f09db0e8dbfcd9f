#pragma once

// Cutting a model into stages: contiguous runs of layer blocks, one per stage, chosen so that
// the slowest stage, which sets a pipeline's pace, costs as little as it can.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/config/job_config.h"

namespace troupe::actors {

/// Blocks [first, last) of model.layers that one stage holds.
struct stage_range {
  size_t first = 0;
  size_t last = 0;
};

/// What one block costs the stage that holds it for one key, in one unit for all blocks (seconds
/// when measured, nominal seconds when estimated).
struct block_cost {
  double forward = 0;
  double backward = 0;        ///< the backward pass without the input gradient
  double input_gradient = 0;  ///< what computing the input gradient adds to the backward pass
  double step = 0;            ///< the block's optimizer step, divided by the keys per step
  /// What a stage pays to send or receive the block's output and its gradient when a stage
  /// boundary follows the block (each of the two stages at the boundary pays it).
  double message = 0;
  /// False for blocks with no parameterized block before them in the model: the engine skips
  /// their input gradient (stage 0 sends none back).
  bool input_gradient_needed = true;
};

/// How many of the model's first blocks compute no input gradient: those up to and including
/// the first with parameters (layers::sequential skips them, as no stage needs the model's
/// input gradient); all of them when none has parameters, 0 when the shapes do not chain.
size_t blocks_without_input_gradient(const job_config& config);

/// The parts an instance of a dynamic model is taken to have where a partition is estimated
/// before the data is seen (a sentence's words, a short text's bytes are of this order).
inline constexpr double nominal_parts_per_instance = 32;

/// Memory traffic of element-wise work, optimizer steps and copies in the estimates, bytes per
/// second (DRAM: 30-50 GB/s).
inline constexpr double nominal_bytes_per_s = 40e9;

/// Per block of `config`'s model, whether a stage may well begin there: in front of a block with
/// weights or a flatten, not in front of an activation, pooling or dropout (a boundary there
/// sends the same tensor as one a block earlier or later, or a larger one).
std::vector<bool> good_stage_starts(const job_config& config);

/// A partition and what the costs it was chosen by predict for each stage.
struct partition_plan {
  std::vector<stage_range> ranges;
  std::vector<double> stage_costs;  ///< per key, in the block costs' unit
};

/// Keys a stage trains on between two optimizer steps: parallelism.min_update_interval, else
/// parallelism.micro_batches (an optimizer step's cost per key is its cost divided by these).
int keys_between_steps(const job_config& config);

/// Each block's cost estimated from the model's shapes for a key of training.batch_size /
/// parallelism.micro_batches samples: GEMM multiply-adds at a nominal rate, other work (the
/// element-wise blocks, the optimizer step, the messages) as memory traffic at a nominal
/// bandwidth. Nothing, with `error` naming the key, when the model's shapes do not chain.
std::optional<std::vector<block_cost>> estimated_block_costs(const job_config& config,
                                                             std::string* error);

/// The cost of the stage of blocks `range` per key: every block's forward, backward and step,
/// the input gradients except those of the blocks up to the model's first with parameters (no
/// stage needs the model's input gradient), and the messages at the boundaries on either side.
double stage_cost(const std::vector<block_cost>& costs, stage_range range);

/// The `stages` contiguous ranges of `costs` (1 <= stages <= costs.size()) whose most costly
/// stage costs least (exact dynamic programming); ties prefer boundaries in front of blocks that
/// `good_starts` marks (all when empty).
std::vector<stage_range> cheapest_ranges(const std::vector<block_cost>& costs, int stages,
                                         const std::vector<bool>& good_starts = {});

/// The stages of `config`'s model per parallelism.partition: "uniform" (equal numbers of
/// blocks), "balanced" (cheapest_ranges() over estimated_block_costs()), "measured" (the same
/// over `measured` costs, one per block; "balanced" when none are given) or cut points "3,7"
/// (block indices where stages 1, 2, ... begin), with each stage's cost by `measured`, else by
/// the estimate. A parameterless block (activation, pooling, dropout) never starts a stage
/// unless it must. Returns nothing with `error` naming the key when the model's shapes do not
/// chain or the cut is impossible.
std::optional<partition_plan> plan_partition(const job_config& config,
                                             const std::vector<block_cost>* measured,
                                             std::string* error);

/// The ranges of plan_partition(config, nullptr, error): "measured" cuts as "balanced" here, so
/// the command that starts a run resolves it into cut points first (every process then cuts
/// alike).
std::optional<std::vector<stage_range>> partition_model(const job_config& config,
                                                        std::string* error);

/// The cut points of `ranges` as parallelism.partition spells them: "3,7" (empty for one stage).
std::string cut_points_text(const std::vector<stage_range>& ranges);

/// Each stage's share of the plan's predicted cost: "49.8%, 50.2%".
std::string predicted_shares(const partition_plan& plan);

/// The most costly stage's share of the plan's predicted cost, in [0, 1].
double largest_share(const partition_plan& plan);

/// One line that names the partition's stages by the blocks of `config`'s model as its job file
/// numbers them and each one's share of the predicted cost, e.g. "stages [0,3) [3,7); predicted
/// share 49.8%, 50.2%", or "stages [0,4:736) [4:736,11); ..." where a stage begins inside
/// block 4 (actors/config/layer_cuts.h).
std::string describe_plan(const job_config& config, const partition_plan& plan);

}  // namespace troupe::actors
