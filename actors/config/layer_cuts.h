#pragma once

// Cut points of parallelism.partition, including cuts inside a layer. "3,7" starts stages at
// blocks 3 and 7; "3:740" starts a stage inside block 3, a linear layer, at its output 740: the
// stage before computes outputs [0, 740) and sends them with the layer's input, the stage after
// computes the rest (layers/split_linear_layer.cpp). A convolution that keeps its image's size
// is cut by its output channels the same way (layers/split_convolution_layer.cpp). A job_config
// holds such a model expanded: the cut layer becomes a head and a tail block (linear_head and
// linear_tail, conv2d_head and conv2d_tail) and the partition whole-block cut points of the
// expanded model, so that every stage, the simulator and the partitioner see ordinary blocks.
// written_job() turns it back into the job as a file writes it.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "actors/config/job_config.h"

namespace troupe::actors {

/// Where a stage begins: at block `block` of model.layers as the job file writes it, or inside
/// it at output `row` (> 0) of that linear layer (output channel of that convolution).
struct cut_point {
  int64_t block = 0;
  int64_t row = 0;
};

/// Parses "3,7" or "3:740,7" (blocks >= 1, rows >= 1); false when a part is neither.
bool parse_cut_points(const std::string& text, std::vector<cut_point>* cuts);

/// "3:740,7".
std::string cut_points_text(const std::vector<cut_point>& cuts);

/// Checks the cut points in `config`'s parallelism.partition against its model (one per stage
/// boundary, increasing, within the model, a cut inside a block only among a linear layer's
/// outputs or a same-size convolution's channels) and expands every cut inside a layer as
/// described above. Named partitions pass
/// unchanged. An empty string when they fit, else one line naming the key.
std::string expand_cut_points(job_config* config);

/// Where the parts of cut layers among blocks [first, last) of `config`'s (expanded) model lie
/// in their layers' whole tensors: by the layer's parameter name prefix ("linear4", "conv2d3":
/// the layer's written index, as a stage names its parameters), the first row of the part and
/// the whole layer's rows (its `out`). A whole-layer weight [out, ...] or bias [out] gives the
/// part its rows from there.
std::map<std::string, std::pair<int64_t, int64_t>> cut_layer_rows(const job_config& config,
                                                                  size_t first, size_t last);

/// The stage bound at block `index` of `config`'s (expanded) model as the job file numbers its
/// blocks: "5", or "4:736" where the bound falls inside the cut layer 4 (its tail's start).
std::string written_bound(const job_config& config, size_t index);

/// `config` as its job file writes it: each cut linear layer whole again, and the cut points
/// with "block:row" for the cuts inside one.
job_config written_job(const job_config& config);

}  // namespace troupe::actors
