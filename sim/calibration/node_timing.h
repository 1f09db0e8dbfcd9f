#pragma once

// Timing a model graph's nodes (model.nodes) one at a time on this machine, for real (real
// clocks), as a stage runs them: a node's visit at each of a few row counts, for `troupe
// calibrate`'s node tables (sim/profile.h), which the simulator charges per visit of each key's
// route (sim/graph_cost.h).

#include <cstdint>
#include <vector>

#include "actors/config/job_config.h"
#include "layers/backend.h"
#include "layers/instance.h"
#include "sim/profile.h"

namespace troupe::sim {

/// `count` keys of `instances_per_key` instances of `train` each, drawn from `seed` (with
/// replacement, as shuffled epochs draw them): the routes the job's keys take.
std::vector<std::vector<layers::instance>> sample_keys(const layers::instance_dataset& train,
                                                       int64_t instances_per_key, int count,
                                                       uint64_t seed);

/// The row counts at which to time a node whose visits over the sample keys have `visit_rows`:
/// the powers of two from the one at or below the fewest rows up to the most rows, and the
/// most; at most `most_points` of them (the largest kept).
std::vector<int64_t> timed_rows(const std::vector<int64_t>& visit_rows, size_t most_points = 12);

/// What timing a node needs to know.
struct node_timing_plan {
  size_t node = 0;            ///< index in the order rows visit the graph
  std::vector<int64_t> rows;  ///< the training visits' row counts to time (timed_rows())
  int64_t visits_per_key =
      1;  ///< a loop or tree node's visits of a timed key (the sample's median)
  /// The evaluation keys' visits' row counts (empty: `rows`), and their visits per key.
  std::vector<int64_t> evaluation_rows;
  int64_t evaluation_visits_per_key = 1;
};

/// Times node `plan.node` of `config`'s graph alone on `device`, as a stage of that node runs it:
/// keys of `rows` instances whose route makes `visits_per_key` visits of `rows` rows each (a
/// chain node: one visit), forward, backward (every other round without the input gradient), a
/// weight stash, a predicted copy where the job predicts weights and the step; and evaluation
/// forwards at the evaluation rows, on keys of their visits. The keys of every row count take
/// turns round by round, each until it has had an equal share of `seconds` and at least six
/// rounds after an untimed one (three of keys of eight visits or more, and of evaluations).
/// Medians, per visit.
node_profile time_node(const actors::job_config& config, const node_timing_plan& plan,
                       layers::backend& device, double seconds);

}  // namespace troupe::sim
