#pragma once

// Cutting inside a layer (actors/config/layer_cuts.h) where whole blocks cannot balance
// the stages: a model whose cost sits in a few large layers, such as an MLP of 1024-wide layers
// on two stages, cannot come closer than one layer's cost to an even split by cuts between
// blocks alone.

#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/partition.h"

namespace troupe::actors {

/// The cut points, as parallelism.partition spells them ("3,7", or "3:512" for a cut inside
/// block 3), of the partition of `config` into parallelism.stages stages whose most costly stage
/// costs least by `costs`: exact dynamic programming over the blocks' starts and the rows inside
/// linear layers, 16 outputs apart, and same-size convolutions' channels, one by one up to 64
/// (further apart where that would take long), one cut per layer at most. Cuts inside layers are
/// chosen only when they make the most costly stage more than 1 % cheaper than whole blocks can.
/// `config` holds no cut layer.
std::string cheapest_cut_points(const job_config& config, const std::vector<block_cost>& costs);

/// `costs`, one per block of `config`'s expanded model, with each cut layer's head and tail
/// taken together again: one per block of the job as its file writes it, a cut layer costing
/// what its parts did (their copies included), so that whole blocks and the cuts compare under
/// one timing.
std::vector<block_cost> joined_cut_costs(const job_config& config,
                                         const std::vector<block_cost>& costs);

}  // namespace troupe::actors
