#pragma once

// A model graph's stages timed as a pipeline runs them, and the node tables fitted to them. A
// node timed alone keeps a core and its caches to itself; in training its stage computes beside
// the other stages, on keys of every size the data has, and one key's passes take longer (the
// fortunes LSTM's head took 1.3 to 1.5 times its time alone beside the looped cell). So the
// job's stages are timed at once, each core group on a thread of its own, on keys drawn from the
// job's data, and each stage's node tables are scaled so that they predict, visit by visit, what
// the stage measured for those keys: the fitted model still charges each key its own visits.

#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/graph_program.h"
#include "actors/engine/partition.h"
#include "layers/instance.h"
#include "sim/profile.h"

namespace troupe::sim {

/// One stage's passes over the keys it was timed on, beside the other stages, and what the node
/// tables predict for the same keys.
struct graph_stage_timing {
  actors::stage_range range;
  double forward_s = 0, backward_s = 0;  ///< measured, summed over the timed keys
  double predicted_forward_s = 0, predicted_backward_s = 0;
  /// Each timed key's forward and backward time over their prediction (the spread of the
  /// stage's work around the model).
  std::vector<double> ratios;
  double step_s = 0, stash_s = 0, predict_s = 0;  ///< medians per step
};

/// Times every stage of `ranges` (× the job's replicas) with the job's threads, the stages
/// that compute at once on threads of their own, on `keys` in turn (rounds of the keys a stage
/// takes between steps, their forwards, their backwards, a stash where the job stashes, and the
/// step), until each group has run `seconds` per node of its stages and every stage twelve
/// keys (three rounds at least) after an untimed round; predictions from `profile`'s node tables.
/// One entry per stage (its replicas pooled); nothing, with `error` set, when a backend cannot be
/// made.
std::optional<std::vector<graph_stage_timing>> time_graph_stages(
    const actors::job_config& config, const actors::ordered_graph& graph,
    const std::vector<actors::stage_range>& ranges, const machine_profile& profile,
    const std::vector<std::vector<layers::instance>>& keys, double seconds, std::string* error);

/// Scales each stage's node tables (forward and evaluation by its forward's measured over
/// predicted, both backwards by its backward's, the step, stash and predicted copy to the
/// stage's medians) so that they predict what `timings` measured. Pure arithmetic.
void fit_nodes_to_stages(const std::vector<graph_stage_timing>& timings,
                         std::vector<node_profile>* nodes);

}  // namespace troupe::sim
