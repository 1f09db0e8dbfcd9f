#pragma once

// Runs the coordinator and stage state machines in one thread (a test driver: the hosts are
// actors/hosts and sim/): messages wait in per-stage
// queues (one for forwards, one for backwards, as separate channels would deliver them). Seed
// 0 runs lock-step rounds in which every stage with work handles one message, backward first:
// the order of a pipeline whose stages take equal time. Other seeds pick any ready queue at
// random, which explores the interleavings that real timing can produce. Tests use it to check
// exactness and staleness bounds over many interleavings; the real hosts replace the queues with
// actors and sockets.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/config/job_data.h"
#include "actors/engine/admission.h"
#include "actors/engine/stage_logic.h"
#include "actors/engine/stage_settings.h"
#include "actors/engine/training_run.h"
#include "layers/dataset.h"
#include "layers/random.h"

namespace troupe::actors {

struct pipeline_totals {
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t samples = 0;
};

class local_pipeline {
 public:
  /// Builds one stage_device per stage of `config` (partitioned per its [parallelism]) on
  /// `device`, to train on `train_samples` samples for `total_steps` steps (which the
  /// learning-rate schedule needs). `order_seed` 0 delivers messages oldest first; other seeds
  /// shuffle deliveries.
  local_pipeline(const job_config& config, layers::backend& device, int64_t train_samples,
                 int64_t total_steps, uint64_t order_seed);

  /// Trains the next `steps` optimizer steps over `data` (train_samples of them) in the job's
  /// data order.
  pipeline_totals train(const layers::dataset& data, int64_t steps);

  /// Runs the whole job on fresh stages as the real hosts do, its coordinator a training_run
  /// (epochs, evaluations, metrics to `observer`, the summary) whose times are read from
  /// `clock` once per report; checkpoints are skipped as they fall due. Deliveries go as in
  /// train(). Call it once, on a pipeline built for data.train's size and the job's steps.
  training_summary run(const job_data& data, clock_source& clock, training_observer& observer);

  /// Stage actor `index` (replica · stages + stage; stage_settings.h).
  stage_logic& stage(int index) { return *stages_[index]; }
  stage_device& device_of(int index) { return *devices_[index]; }
  /// Every stage's weights, in stage and layer order, copied to the host.
  std::vector<std::vector<float>> weights();
  int stage_count() const { return static_cast<int>(stages_.size()); }
  /// Most keys in flight at once during train().
  int64_t peak_active() const { return peak_active_; }
  /// Called after every delivery (tests check invariants there).
  std::function<void()> after_delivery;

 private:
  struct mailbox {
    std::deque<key_message> forwards;
    std::deque<key_message> backwards;
    std::deque<key_message> chunks;  ///< from the same stage of the previous replica
  };
  enum class channel { forward, backward, chunk, ready_pass };

  key_message make_forward(const layers::dataset& data, const admission& entry);
  void admit(const layers::dataset& data, admission_policy& coordinator);
  /// Picks a ready queue, or a stage's ready pass (zero-bubble), at random; false when none.
  bool next_delivery(int* stage, channel* from);
  key_message take(int stage, channel from);
  using coordinator_inbox = std::function<void(stage_output&&)>;
  /// Delivers one message (a random ready one when shuffled, else a lock-step round in which
  /// every stage with work handles one, backward first); false when none was waiting.
  bool deliver(const coordinator_inbox& to_coordinator);
  bool deliver_one(const coordinator_inbox& to_coordinator);
  /// Hands a stage's outputs to the next or previous stage, or to the coordinator.
  void route(int stage, std::vector<stage_output> outputs, const coordinator_inbox& to_coordinator);

  job_config config_;
  layers::backend& backend_;
  int64_t total_steps_;
  int64_t steps_done_ = 0;
  std::vector<std::unique_ptr<stage_device>> devices_;
  std::vector<std::unique_ptr<stage_logic>> stages_;
  std::vector<mailbox> mailboxes_;
  layers::random_generator order_;
  bool shuffled_;
  uint64_t arrival_ = 0;
  int64_t peak_active_ = 0;
  layers::batch_order batches_;
  int64_t current_epoch_ = -1;
};

}  // namespace troupe::actors
