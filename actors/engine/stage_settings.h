#pragma once

// What a stage of a job runs with, derived from the job alone: its stage_logic settings and the
// CPU threads its backend may use. Engine logic: no CAF, no sockets; the CAF host, the test
// driver and the simulator all take their stages' settings from here.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/stage_logic.h"

namespace troupe::actors {

/// The settings of stage `index` of `config` (its update interval, gradient scale, learning
/// rate schedule over `steps_per_epoch` and `total_steps`). `turns` are the job's
/// make_pass_turns(), made once for all the stages of a replica in a process: the stages of
/// one worker share its turn. `replica`: which of parallelism.replicas copies it belongs to.
stage_settings stage_settings_of(const job_config& config, int index, int64_t steps_per_epoch,
                                 int64_t total_steps,
                                 const std::vector<std::shared_ptr<pass_turn>>& turns,
                                 int replica = 0);

/// Keys per optimizer step: parallelism.micro_batches of each of parallelism.replicas. Key k
/// is micro-batch k % M of replica (k / M) % R in step k / (R·M), and holds the samples from
/// (k % (R·M)) · batch_size / (R·M) of that step's batch: replica r reads the r-th R-th of
/// every batch, so the data order is the sequential one.
int keys_per_step(const job_config& config);

/// Whether the stages run the delay-corrected Nesterov method (stage_settings::
/// nesterov_momentum): staleness_correction = "nesterov" in async mode.
bool nesterov_correction(const job_config& config);
/// Samples per key: training.batch_size / keys_per_step().
int64_t micro_batch_size(const job_config& config);
/// The stage actor a key enters at: stage 0 of the replica its training key belongs to
/// (evaluation keys go to replica 0).
int entry_actor_of_key(const job_config& config, uint64_t key);

/// Stage actors of the job: parallelism.stages of each of parallelism.replicas. Hosts number
/// them replica by replica (stage actor replica · stages + stage), in addresses, wire routes
/// and worker assignments alike.
int stage_actor_count(const job_config& config);
inline int stage_of_actor(const job_config& config, int actor) {
  return actor % config.parallelism.stages;
}
inline int replica_of_actor(const job_config& config, int actor) {
  return actor / config.parallelism.stages;
}
/// The same stage of the next replica: where `actor`'s ring all-reduce pieces go.
inline int replica_peer_of_actor(const job_config& config, int actor) {
  const int stages = config.parallelism.stages;
  return (replica_of_actor(config, actor) + 1) % config.parallelism.replicas * stages +
         stage_of_actor(config, actor);
}

/// The CPU threads the job's stages share: parallelism.threads, or every core when it is 0.
int job_threads(const job_config& config);

/// Workers that run the stages at once: one per stage, or stages / virtual_stages under the
/// interleaved schedule (each worker hosting virtual_stages of them).
int pipeline_workers(const job_config& config);

/// Whether stages handle a waiting backward pass before forwards that arrived earlier: the
/// sync schedules after GPipe (1F1B, ZB-H1, interleaved), whose order of work is one forward,
/// one backward. The simulator orders its queues so; the CAF host keeps arrival order (its
/// forwards wait only at max_forward_keys); the stage logic accepts any order, holding a
/// message until its turn under the schedules with a fixed order (pass_order.h).
bool backward_first(const job_config& config);

/// The CPU threads each stage's backend may use: job_threads() split evenly over the workers of
/// every replica.
int threads_per_stage(const job_config& config);

/// The device of stage `stage` per parallelism.devices (one for all, or one per stage).
const std::string& device_of_stage(const job_config& config, int stage);
/// The device of stage actor `actor` (replica after replica): its own entry when
/// parallelism.devices names one per stage actor, else its stage's.
const std::string& device_of_actor(const job_config& config, int actor);

}  // namespace troupe::actors
