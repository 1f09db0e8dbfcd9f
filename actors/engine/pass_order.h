#pragma once

// Fixed orders of a pipeline worker's passes over one step's micro-batches, for the schedules
// whose published bubble needs them (a stage that took whatever came first would, with
// unequal passes, start a pass just before the one the pipeline waits for).
//
// - ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"): each micro-batch's backward
//   pass is split into B (the input gradient, which the previous stage waits for) and W (the
//   weight gradients, which nobody waits for). Stage i runs 1F1B's order of F and B and delays
//   its W so that it holds up to p micro-batches between their F and their W (stage 0's 1F1B
//   peak): the W then fill the cool-down, where 1F1B idles. With F, B and W of equal length
//   the bubble is (p − 1) / (3m + p − 1) of the time when m ≥ p, a third of 1F1B's.
// - Interleaved 1F1B (Narayanan et al. 2021, Megatron-LM): worker w hosts the chunks (stages)
//   w, w + p, …; it runs (p − w − 1)·2 + (v − 1)·p forwards, then one forward and one
//   backward in turn, visiting its chunks p micro-batches at a time (forwards in chunk order,
//   backwards in reverse). The bubble is (p − 1) / (v·m + p − 1); m must be a multiple of p.

#include <atomic>
#include <memory>
#include <vector>

#include "actors/config/job_config.h"

namespace troupe::actors {

struct scheduled_pass {
  /// backward: the whole backward pass; input_gradient and weight_gradients: its halves.
  enum class kind { forward, input_gradient, weight_gradients, backward };
  kind what = kind::forward;
  int micro_batch = 0;
  int stage = 0;  ///< the stage (model chunk) that runs it

  bool operator==(const scheduled_pass& other) const {
    return what == other.what && micro_batch == other.micro_batch && stage == other.stage;
  }
};

/// Stage `index` of `stages`' passes over one step's `micro_batches` micro-batches, in order:
/// F of min(p − i, m) micro-batches, then B, W and F in turn, each W as soon as the stage
/// holds p micro-batches or has no F left, every remaining W at the end.
std::vector<scheduled_pass> zero_bubble_order(int stages, int index, int micro_batches);

/// Worker `worker` of `workers`' passes over its `chunks` chunks (stages worker + c·workers)
/// for `micro_batches` micro-batches, a multiple of `workers`.
std::vector<scheduled_pass> interleaved_order(int workers, int chunks, int worker,
                                              int micro_batches);

/// Where a worker stands in its order: the stages it hosts share it, and each runs a pass of
/// its own only when that pass is next. The stage whose pass is next is the only one that
/// advances it.
struct pass_turn {
  explicit pass_turn(std::vector<scheduled_pass> passes);

  const std::vector<scheduled_pass> order;
  /// Whether backward passes are split into B and W.
  const bool splits_backward;
  std::atomic<size_t> next{0};

  const scheduled_pass& next_pass() const { return order[next.load(std::memory_order_acquire)]; }
  /// Moves on by one pass, back to the first after the step's last.
  void advance();
};

/// The turns of a job's pipeline workers (pipeline_workers()), indexed by worker; empty when
/// its stages run passes as messages come (GPipe, 1F1B, async, and interleaved with a number
/// of micro-batches that is not a multiple of the workers).
std::vector<std::shared_ptr<pass_turn>> make_pass_turns(const job_config& config);

/// The pipeline worker that runs stage `stage`: the stage itself, or under the interleaved
/// schedule stage mod workers.
int pipeline_worker_of(const job_config& config, int stage);

/// Which of `processes` worker processes hosts stage actor `actor` (replica · stages + stage,
/// stage_settings.h): contiguous runs of pipeline workers, replica by replica, so that a
/// worker's interleaved chunks stay in one process; contiguous runs of stage actors when there
/// are more processes than pipeline workers.
int process_of_stage(const job_config& config, int actor, int processes);

/// Drops from `turns` (replica `replica`'s) those of the pipeline workers whose stages are not
/// all among `local_actors` (stage actors): a turn is shared in one process only, so such
/// stages run their passes as they come.
void keep_local_turns(const job_config& config, const std::vector<int>& local_actors, int replica,
                      std::vector<std::shared_ptr<pass_turn>>* turns);

}  // namespace troupe::actors
