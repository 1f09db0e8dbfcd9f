#pragma once

// The discrete-event host behind simulate() (simulation.h), internal to sim/. Its parts:
// simulation.cpp builds the pipeline, runs the event loop and carries messages over the
// network; device_scheduling.cpp gives the devices their work (a device or a node's pool, the
// coordinator's turns on a shared scheduler, time-sliced pools); checkpoints_and_failures.cpp
// takes checkpoints and recovers from failed workers.

#include <xxhash.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "actors/engine/checkpoint_round.h"
#include "actors/engine/recovery.h"
#include "actors/engine/stage_logic.h"
#include "actors/engine/stage_state.h"
#include "actors/engine/training_run.h"
#include "layers/backend.h"
#include "sim/network_model.h"
#include "sim/simulation.h"
#include "sim/timed_stage_device.h"

namespace troupe::sim::internal {

using actors::key_message;
using actors::stage_output;

constexpr int coordinator = -1;  ///< the target of reports; the coordinator's trace track
constexpr int any_stage = -2;    ///< simulator::next_ready: a parcel for any actor

/// Bytes of a message's payload and labels (its frames after the header).
double payload_bytes(const key_message& message);

enum class event_kind : uint8_t {
  deliver,
  work_done,
  sliced_work_done,
  degrade,
  checkpoint_written,
  worker_fails,
  workers_rejoined,
  start_flow  ///< a parcel held by its sender's CPU goes onto the network
};

struct event {
  double time;
  uint64_t sequence;
  event_kind kind;
  /// The pipeline generation that scheduled it: a failure starts a new one, and the work and
  /// checkpoints of the old one come to nothing.
  uint16_t generation;
  int32_t index;
};

/// Most failures one simulation takes (the generation counter's range).
constexpr size_t kMaxFailures = 60000;

struct later {
  bool operator()(const event& a, const event& b) const {
    return a.time != b.time ? a.time > b.time : a.sequence > b.sequence;
  }
};

/// A message on its way: to a stage, or a report to the coordinator.
struct parcel {
  uint16_t generation = 0;
  int target = 0;
  int from_track = 0;
  int from_device = 0;
  double sent_s = 0;
  double latency_s = 0;
  stage_output content;
  /// A report whose receiving end the coordinator's CPU has taken (it is handled when it
  /// arrives again, at the end of that).
  bool received = false;
};

/// What a checkpoint holds: where the run stood and every stage's shard (its serialized state).
struct checkpoint_image {
  actors::run_progress progress;
  std::vector<std::string> shards;
  double taken_s = 0;  ///< virtual time
};

struct device_state {
  int pool = 0;  ///< index into simulator::pools_
  bool busy = false;
  int stage = 0;  ///< of the work running
  std::vector<stage_output> outputs;
  double straggle_probability = 0;
  double slowdown = 1;
};

/// Devices that take work from one queue: a device alone, or a node's pooled devices.
struct pool_state {
  std::vector<int> devices;
  std::deque<int> waiting;  ///< parcels, in arrival order
  /// Time-sliced (device_model::time_sliced): the stages at work share the devices equally,
  /// each at most one whole device; their work advanced until `updated_s`.
  bool time_sliced = false;
  std::vector<int> working;
  double updated_s = 0;

  /// Stage processes (a worker's chunks are one) that run on the pool's devices.
  size_t processes = 0;

  /// device_model::time_slice_efficiency: where the pool hosts more stage processes than it has
  /// devices, the share of the devices that the stages' work gets while it keeps every device
  /// busy: the operating system's switches and the other processes' wake-ups take the rest,
  /// which a pool with a device to spare absorbs.
  double efficiency = 1;

  /// Devices' worth of work each working stage gets per second: a whole device while a device
  /// is to spare, else an equal share of what the operating system leaves the stages' work.
  double sliced_rate() const {
    const double stages = static_cast<double>(working.size());
    const double shared = static_cast<double>(devices.size());
    if (stages < shared) return 1.0;
    return (processes > devices.size() ? shared * efficiency : shared) / stages;
  }
};

/// What a stage's handling of one message gives and costs.
struct charged_work {
  std::vector<stage_output> outputs;
  double seconds = 0;     ///< of work on a whole device
  const char* name = "";  ///< its span's
  int64_t key = 0;
};

/// A stage's work in a time-sliced pool.
struct sliced_work {
  charged_work work;
  double remaining_s = 0;  ///< of work.seconds
  double started_s = 0;
  uint64_t finish_sequence = 0;  ///< of the one work_done event that is not stale
};

/// One simulation of one job on one cluster: build() places the stages and checks the options,
/// run() runs the event loop until the run finishes or fails, result() is what it measured.
class simulator {
 public:
  simulator(const actors::job_config& config, const actors::job_data& data,
            const cluster_model& cluster, const simulation_options& options,
            actors::training_observer& observer)
      : config_(config),
        data_(data),
        cluster_(cluster),
        options_(options),
        observer_(observer),
        random_(options.seed),
        hash_(XXH3_createState()) {
    XXH3_64bits_reset(hash_);
  }
  ~simulator() { XXH3_freeState(hash_); }

  bool build(std::string* error);
  bool run(std::string* error);
  simulation_result result();

 private:
  void schedule(double time, event_kind kind, int index);
  void hash(const void* data, size_t bytes) { XXH3_64bits_update(hash_, data, bytes); }
  int new_parcel(parcel&& p);
  /// Sends `content` `delay_s` from now (the sender's CPU still busy with it until then).
  void send(int from_device, int target, stage_output&& content, int from_track,
            double delay_s = 0);
  void deliver(int id);
  /// The device a parcel for `target` (a stage, or the coordinator) goes to.
  int device_of_target(int target) const {
    return target == coordinator ? cluster_model::host_device : device_of_stage_[target];
  }
  /// The network part of send() for a parcel whose sender held it a while.
  void start_flow(int id);
  /// Starts waiting work on the pool's free devices: each takes the oldest parcel whose stage
  /// is not already at work (a stage, like its actor, handles one message at a time).
  void start_work(int pool);
  /// The pool on which the coordinator takes turns with the stages (coordinator_pool_), or -1.
  int shared_coordinator_pool() const;
  /// A device of coordinator_pool_ takes report `id` off the coordinator's inbox: the run
  /// handles it, and the keys it admits leave when the work is done.
  void begin_coordinator_work(int device, int id);
  /// The parcel a free device of `queue` takes next: the oldest whose stage is free and may
  /// take it (a forward waits while its stage holds max_forward_keys), a backward first where
  /// the schedule says so, and of that stage's messages a ring chunk first; waiting.end() when
  /// none. With `only_stage`, that stage's only.
  std::deque<int>::iterator next_ready(pool_state& queue, int only_stage = any_stage);
  /// next_ready()'s choice of stage: the oldest parcel that a free stage may take (a backward
  /// first where the schedule says so), before the stage's ring chunks go first.
  std::deque<int>::iterator next_for_a_stage(pool_state& queue, int only_stage);
  /// Device `device` begins the parcel next_ready() gives; false when there is none.
  bool take_next(int device, pool_state& queue, int only_stage = any_stage);
  /// Whether parcel `id` may not be handled yet (its stage holds such messages back).
  bool must_wait(int id) const;
  /// Device `device` handles parcel `id` and is busy for the time it is charged.
  void begin_work(int device, int id);
  /// A free device with no message waiting runs the next pass of a stage's zero-bubble order
  /// (a W, or a message that came before its turn), if one of its stages has one ready.
  void begin_ready_work(int device);
  /// Stage `stage` runs the next pass of its fixed order (a W, or a message that came early).
  charged_work run_ready_pass(int stage);
  /// The CPU time of taking `incoming` (when given) and of sending `outputs`: a fixed part per
  /// message and a part per payload byte.
  double message_cpu_s(const key_message* incoming, const std::vector<stage_output>& outputs) const;
  /// `seconds` of work on `device` with the device's spread (device_model::work_jitter).
  double jittered(int device, double seconds);
  /// The coordinator's CPU seconds for a key it admits: its batch gathered (the profile's
  /// coordinator_s_per_sample) and the key sent.
  double admission_s(const key_message& message) const;
  /// CPU seconds of one end of `message` (its send or its receipt).
  double message_end_s(const key_message& message) const;
  void finish_work(int device);
  /// Stage `stage` handles parcel `id` (hashed into the trace), charged on device `device`.
  charged_work handle(int stage, int device, int id);
  /// A time-sliced pool: its works advanced to now at the rate they ran since the last change.
  void advance_sliced(pool_state& pool);
  /// A time-sliced pool: every work's end at its rate from now on.
  void schedule_sliced(pool_state& pool);
  void finish_sliced_work(int stage, uint64_t sequence);
  void send_outputs(int device, int stage, std::vector<stage_output>&& outputs);
  void dispatch(std::vector<key_message>&& messages);
  void after_run_changed();
  void degrade(int index);
  /// The pipeline is quiet for a checkpoint: takes the stages' states, and the checkpoint is
  /// written after the storage's time for their bytes.
  void begin_checkpoint();
  void checkpoint_written();
  void worker_fails(int index);
  /// The replacement has joined: every stage loads the latest checkpoint and a new run starts.
  void workers_rejoined();
  /// Virtual seconds to write or read every stage's state.
  double storage_s() const;
  /// The coordinator's run, from its start or continuing from `resume`.
  std::unique_ptr<actors::training_run> new_run(std::optional<actors::run_progress> resume);
  /// The links from device `from` to device `to` (either may be the host) and their latency.
  const std::pair<std::vector<int>, double>& route(int from, int to);

  const actors::job_config& config_;
  const actors::job_data& data_;
  const cluster_model& cluster_;
  const simulation_options& options_;
  actors::training_observer& observer_;
  std::mt19937_64 random_;
  XXH3_state_t* hash_;

  std::vector<std::unique_ptr<layers::backend>> backends_;  ///< numerics mode
  std::unique_ptr<layers::backend> host_backend_;
  std::unique_ptr<actors::training_run> run_;
  std::vector<std::unique_ptr<timed_stage_device>> stage_devices_;
  std::vector<std::unique_ptr<actors::stage_logic>> stages_;
  std::vector<int> device_of_stage_;
  std::vector<double> stage_busy_s_;
  std::vector<device_state> devices_;
  std::vector<pool_state> pools_;
  std::vector<bool> stage_at_work_;
  std::vector<sliced_work> sliced_;  ///< per stage
  std::unique_ptr<network_model> network_;
  std::unordered_map<uint64_t, int> flow_parcels_;
  std::unordered_map<uint64_t, std::pair<std::vector<int>, double>> routes_;
  std::vector<parcel> parcels_;
  std::vector<int> free_parcels_;
  std::priority_queue<event, std::vector<event>, later> events_;
  uint64_t sequence_ = 0;
  double now_ = 0;
  /// When the coordinator's thread is free: it is one thread, which assembles each key it
  /// admits (the profile's coordinator_s_per_sample) and sends it, and takes each report off its
  /// inbox, one after another (a message end each, as a stage's).
  double coordinator_free_s_ = 0;
  /// The pool whose devices also run the coordinator (-1: it has a thread of its own): in one
  /// process whose stage actors outnumber its cores, the coordinator actor takes turns with
  /// them on the scheduler's threads, as one more actor with a mailbox.
  int coordinator_pool_ = -1;
  bool coordinator_at_work_ = false;
  /// Keys the coordinator admitted in the work a device of coordinator_pool_ is doing.
  std::vector<key_message> admitted_;
  int64_t events_handled_ = 0;
  bool finished_ = false;
  /// Stages take waiting backward passes before forwards (the sync schedules after GPipe).
  bool backward_first_ = false;
  /// The job has replicas, whose ring chunks a stage takes before its other messages.
  bool replicated_ = false;
  /// The replicas sum in a group (parallelism.collective "nccl" or "shared_memory"), timed as
  /// the ring's pieces without the CPU of a message end: the group's collective takes the same
  /// adds and copies on the devices, and no message. Approximate: a group's collective is one
  /// step for all its ranks, where the ring's pieces come one by one.
  bool summed_in_group_ = false;
  /// A shared-memory group's pieces also skip the links (they stay in the process's memory).
  bool group_in_memory_ = false;
  std::string failure_;
  std::unique_ptr<actors::trace_recorder> trace_;
  size_t spans_ = 0;
  // Checkpoints and recovery.
  uint16_t generation_ = 0;
  std::vector<actors::stage_state> initial_states_;  ///< what a restart without checkpoint loads
  std::optional<checkpoint_image> latest_;
  std::optional<checkpoint_image> writing_;
  actors::checkpoint_round round_{1};  ///< collects the stages' states for a checkpoint
  int64_t checkpoints_ = 0;
  double checkpoint_s_ = 0;
  actors::recovery recovery_{config_.checkpoint.max_restarts};
  double recovery_s_ = 0;
  int64_t lost_steps_ = 0;
};

}  // namespace troupe::sim::internal
