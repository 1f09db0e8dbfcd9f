#pragma once

// The coordinator's admission policy as a state machine: which keys may enter the pipeline
// now, given the mode, the schedule and the keys still in flight. With R replicas of the
// pipeline, key k is micro-batch k % M of replica (k / M) % R in optimizer step k / (R·M), so
// every mode reads the data in the sequential order; each replica is admitted on its own (its
// keys in flight bounded as one pipeline's), and in sync mode a step begins once every key of
// the step before has retired in every replica.

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "actors/config/job_config.h"

namespace troupe::actors {

struct admission_settings {
  pipeline_mode mode = pipeline_mode::sync;
  pipeline_schedule schedule = pipeline_schedule::gpipe;  ///< sync mode's
  int stages = 1;
  int micro_batches = 1;  ///< per replica
  int replicas = 1;
  int max_active_keys = 1;
  int min_update_interval = 1;
  int max_staleness = -1;  ///< -1: unbounded
  /// Async mode with replicas: a replica admits a key only while the weight version it brings
  /// its stages to stays within this many versions of the slowest replica's (stale
  /// synchronous parallel; -1: unbounded).
  int replica_staleness = -1;
  int64_t micro_batch_size = 1;
  int64_t total_steps = 0;  ///< stop after this step (absolute)
  int64_t first_step = 0;   ///< start at this step (resuming, or continuing a run)

  /// The settings of a job's [parallelism] and [training] sections for `total_steps` steps.
  static admission_settings of(const job_config& config, int64_t total_steps);
};

/// One key to send into the pipeline.
struct admission {
  uint64_t key = 0;
  int64_t step = 0;
  int micro_batch = 0;
  int64_t sample_offset = 0;  ///< within the step's batch
  int replica = 0;
  /// The slowest replica's stage 0 weight version when the key was admitted.
  int64_t replica_floor = 0;
};

class admission_policy {
 public:
  explicit admission_policy(admission_settings settings);

  /// The keys that may be admitted now (possibly none); each is counted as active.
  std::vector<admission> admit();
  /// A key's backward pass has left stage 0. False (and nothing changes) for a key that is not
  /// in flight: a duplicate or a forgery.
  bool retired(uint64_t key);

  /// Admits no key past the end of the step now being admitted (the sync schedules admit a
  /// step at a time anyway): once the keys in flight retire, the pipeline is quiet at a step
  /// boundary. Returns that step.
  int64_t pause_at_step_boundary();
  /// Admission goes on after a pause.
  void resume() { pause_at_key_ = -1; }
  /// Paused and nothing in flight: every stage has finished every admitted key.
  bool quiet() const;

  bool finished() const;
  /// Keys in flight, over every replica.
  int64_t active() const { return static_cast<int64_t>(active_keys_.size()); }
  /// Keys retired, over every replica.
  int64_t retired_count() const;
  /// Most keys of one replica in flight at once under the settings (MAK, tightened by
  /// max_staleness).
  int64_t admission_limit() const { return limit_; }
  /// The weight version every stage of every replica has reached: the slowest replica's stage
  /// 0 has taken a step per min_update_interval retired keys, and a later stage has seen the
  /// backward passes of at least those keys.
  int64_t slowest_version() const;

 private:
  /// Whether replica `replica`'s next key may enter now.
  bool may_admit_next(int replica) const;
  /// The `local`-th key of replica `replica` (counting its keys alone).
  admission make_admission(int replica, int64_t local) const;
  int64_t active(int replica) const { return admitted_[replica] - retired_[replica]; }
  /// Stale synchronous parallel: replica `replica`'s next key keeps it within
  /// replica_staleness versions of the slowest replica. A stage of it reaches at most version
  /// (admitted + 1) / MUI with that key, and no stage of any replica is below
  /// slowest_version(), so the bound holds at every stage.
  bool within_replica_staleness(int replica) const;

  admission_settings settings_;
  int64_t total_keys_;  ///< per replica
  // Per replica, in its own keys: admitted and retired so far.
  std::vector<int64_t> admitted_;
  std::vector<int64_t> retired_;
  int64_t limit_ = 1;
  int64_t pause_at_key_ = -1;  ///< per replica; -1: not paused
  std::set<uint64_t> active_keys_;
};

}  // namespace troupe::actors
