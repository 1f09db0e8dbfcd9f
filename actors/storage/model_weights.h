#pragma once

// A job's model weights as named tensors (actors/storage/safetensors.h reads and writes them):
// a checkpoint's weights export as "stage{i}.{layer}.{weight|bias}" (layer: the block's type and
// its index in model.layers, e.g. "stage1.linear2.weight"). Block numbering is global, so
// "linear2.weight" alone names the same tensor whatever the number of stages, which lets
// model.init_from load a file exported from a run cut into a different number of stages.

#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/stage_state.h"

namespace troupe::actors {

/// Every stage's parameters, named "stage{i}.{name}" with i = state.stage, in stage order.
std::vector<named_tensor> export_tensors(const std::vector<stage_state>& stages);

/// One state per stage of `config`'s model holding its parameters as the job's seed draws them
/// (what a run starts from without model.init_from). Nothing, with `error`, when the model
/// cannot be partitioned.
std::optional<std::vector<stage_state>> seeded_stage_states(const job_config& config,
                                                            std::string* error);

/// One state per stage of `config`'s model with `parameters` filled from `tensors` (and nothing
/// else: load it with weights_only). Stage i's parameter "linear2.weight" comes from the tensor
/// "stage{i}.linear2.weight", else from "linear2.weight" bare or under another stage's prefix; the
/// part of a linear layer that a partition cuts (actors/config/layer_cuts.h) takes its rows of a
/// whole-layer tensor, or a tensor of its own shape.
/// Nothing, with `error` naming the tensor, when one is missing, ambiguous, has another shape
/// than the model's, or is left over.
std::optional<std::vector<stage_state>> stage_states_from_tensors(
    const std::vector<named_tensor>& tensors, const job_config& config, std::string* error);

/// The initial weights model.init_from names, one state per stage (see above). `error` starts
/// with "model.init_from: <path>: ".
std::optional<std::vector<stage_state>> initial_stage_states(const job_config& config,
                                                             std::string* error);

}  // namespace troupe::actors
