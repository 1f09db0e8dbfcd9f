#pragma once

// Cutting a model into stages: contiguous runs of layer blocks, one per stage.

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

/// The stages of `config`'s model per parallelism.partition: "uniform" (equal numbers of
/// blocks), "balanced" (equal forward GEMM work, so the slowest stage is as fast as it can be)
/// or cut points "3,7" (block indices where stages 1, 2, ... begin). A parameterless block
/// (activation, pooling, dropout) never starts a stage unless it must. Returns nothing with
/// `error` naming the key when the model's shapes do not chain or the cut is impossible.
std::optional<std::vector<stage_range>> partition_model(const job_config& config,
                                                        std::string* error);

}  // namespace troupe::actors
