#pragma once

// The device work of a stage of a model graph (model.nodes): the nodes [range.first,
// range.last) run on a backend over each key's instances (actors/engine/graph_program.h).

#include <memory>

#include "actors/engine/stage_device.h"

namespace troupe::actors {

/// The stage device of nodes `range` of `config`'s graph, with the job's optimizer.
std::unique_ptr<stage_device> make_graph_stage_device(const job_config& config, stage_range range,
                                                      layers::backend& device);

}  // namespace troupe::actors
