#include "sim/simulation.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>
#include <queue>
#include <random>
#include <unordered_map>

#include "actors/engine/checkpoint_round.h"
#include "actors/engine/partition.h"
#include "actors/engine/recovery.h"
#include "actors/engine/stage_logic.h"
#include "actors/engine/stage_settings.h"
#include "actors/engine/stage_state.h"
#include "actors/engine/training_run.h"
#include "layers/backend_registry.h"
#include "layers/model.h"
#include "sim/network_model.h"
#include "sim/shape_backend.h"
#include "sim/timed_stage_device.h"

namespace troupe::sim {
namespace {

using actors::key_message;
using actors::stage_output;

constexpr int coordinator = -1;  ///< the target of reports; the coordinator's trace track
constexpr int any_stage = -2;    ///< simulator::next_ready: a parcel for any actor

/// Bytes of a message's payload and labels (its frames after the header).
double payload_bytes(const key_message& message) {
  double bytes = 0;
  if (!message.payload.empty()) bytes += 4.0 * static_cast<double>(message.payload.size());
  if (message.labels) bytes += 4.0 * static_cast<double>(message.labels->size());
  bytes += 4.0 * static_cast<double>(message.values.count);  // a ring all-reduce's piece
  return bytes;
}

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

  /// device_model::time_slice_efficiency: the share of the devices the stages get while they
  /// outnumber them.
  double efficiency = 1;

  /// Devices' worth of work each working stage gets per second: a whole device while there
  /// are enough, else an equal share of the devices that the operating system gives them.
  double sliced_rate() const {
    const double stages = static_cast<double>(working.size());
    const double shared = static_cast<double>(devices.size());
    return stages <= shared ? 1.0 : shared * efficiency / stages;
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
  /// the schedule says so; waiting.end() when none. With `only_stage`, that stage's only.
  std::deque<int>::iterator next_ready(pool_state& queue, int only_stage = any_stage);
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

bool simulator::build(std::string* error) {
  auto ranges = actors::partition_model(config_, error);
  if (!ranges) return false;
  auto work = model_work(config_, error);
  if (!work) return false;
  auto shapes = layers::infer_shapes(config_.model.layers, config_.model.input_shape, error);
  if (!shapes) return false;
  // Stage actors, replica by replica (stage_settings.h); `stages` of them per replica.
  const int stages = static_cast<int>(ranges->size());
  const int actors_count = actors::stage_actor_count(config_);
  if (options_.numerics) {
    host_backend_ = layers::create_backend("cpu", 1, error);
    if (!host_backend_) return false;
  }
  run_ = new_run(std::nullopt);
  devices_.resize(cluster_.devices.size());
  for (size_t d = 0; d < cluster_.devices.size(); ++d) {
    const device_model& device = cluster_.devices[d];
    size_t pool = pools_.size();
    if (device.pooled) {
      for (size_t p = 0; p < pools_.size(); ++p) {
        const device_model& first = cluster_.devices[pools_[p].devices.front()];
        if (first.pooled && first.node == device.node && first.type == device.type) pool = p;
      }
    }
    if (pool == pools_.size()) {
      pools_.emplace_back();
      pools_.back().time_sliced = device.pooled && device.time_sliced;
      pools_.back().efficiency = device.time_slice_efficiency;
    }
    pools_[pool].devices.push_back(static_cast<int>(d));
    devices_[d].pool = static_cast<int>(pool);
  }
  for (const straggler& slow : options_.stragglers) {
    if (slow.device < 0 || slow.device >= static_cast<int>(devices_.size())) {
      *error = "a straggler names device " + std::to_string(slow.device) + " of a " +
               std::to_string(devices_.size()) + "-device cluster";
      return false;
    }
    devices_[slow.device].straggle_probability = slow.probability;
    devices_[slow.device].slowdown = slow.slowdown;
  }
  const int64_t classes = layers::element_count(shapes->back());
  if (options_.profile && options_.profile->blocks.size() != config_.model.layers.size()) {
    *error = "the profile times " + std::to_string(options_.profile->blocks.size()) +
             " blocks but the job's model has " + std::to_string(config_.model.layers.size()) +
             ": calibrate with this job";
    return false;
  }
  if (options_.profile) {
    for (size_t b = 0; b < config_.model.layers.size(); ++b) {
      if (options_.profile->blocks[b].type != config_.model.layers[b].type) {
        *error = "the profile's block " + std::to_string(b) + " is a " +
                 options_.profile->blocks[b].type + ", the job's a " +
                 config_.model.layers[b].type + ": calibrate with this job";
        return false;
      }
    }
  }
  backward_first_ = actors::backward_first(config_);
  // The interleaved schedule places stage s on worker s % workers, its device; replica r's
  // workers follow replica r − 1's.
  const bool interleaved = config_.parallelism.schedule == "interleaved" &&
                           cluster_.placement.size() != static_cast<size_t>(actors_count);
  const int workers = interleaved ? stages / config_.parallelism.virtual_stages : stages;
  const int replicas = config_.parallelism.replicas;
  std::vector<std::shared_ptr<actors::pass_turn>> turns;
  for (int actor = 0; actor < actors_count; ++actor) {
    const int s = actors::stage_of_actor(config_, actor);
    const int replica = actors::replica_of_actor(config_, actor);
    if (s == 0) turns = actors::make_pass_turns(config_);  // each replica's own
    const int device =
        cluster_.device_of_stage(replica * workers + s % workers, replicas * workers, error);
    if (device < 0) return false;
    device_of_stage_.push_back(device);
    const actors::stage_range range = (*ranges)[s];
    std::vector<block_work> blocks(work->begin() + range.first, work->begin() + range.last);
    stage_cost cost(std::move(blocks), s + 1 == stages ? loss_work(classes) : kernel_work{},
                    cluster_.devices[device]);
    if (options_.profile) {
      const auto& measured = options_.profile->blocks;
      cost.use_measured({measured.begin() + range.first, measured.begin() + range.last},
                        options_.profile->batch, s + 1 == stages ? options_.profile->loss_s : 0,
                        options_.profile->evaluation_batch);
      cost.use_measured_parameter_copy(options_.profile->parameter_copy_s_per_float);
    }
    std::unique_ptr<actors::stage_device> numerics;
    if (options_.numerics) {
      backends_.push_back(layers::create_backend("cpu", actors::threads_per_stage(config_), error));
      if (!backends_.back()) return false;
      numerics = actors::make_layers_stage_device(config_, range, *backends_.back());
    }
    const layers::shape input =
        range.first == 0 ? layers::shape(config_.model.input_shape) : (*shapes)[range.first - 1];
    stage_devices_.push_back(std::make_unique<timed_stage_device>(
        std::move(cost), input, (*shapes)[range.last - 1], std::move(numerics)));
    stages_.push_back(std::make_unique<actors::stage_logic>(
        actors::stage_settings_of(config_, s, run_->steps_per_epoch(), run_->total_steps(), turns,
                                  replica),
        *stage_devices_.back()));
  }
  stage_busy_s_.assign(actors_count, 0);
  stage_at_work_.assign(actors_count, false);
  sliced_.resize(actors_count);
  coordinator_pool_ = shared_coordinator_pool();
  for (auto& stage : stages_) initial_states_.push_back(stage->save_state());
  round_ = actors::checkpoint_round(static_cast<int>(stages_.size()));
  if (options_.failures.size() > kMaxFailures) {
    *error = std::to_string(options_.failures.size()) + " worker failures; at most " +
             std::to_string(kMaxFailures);
    return false;
  }
  for (size_t i = 0; i < options_.failures.size(); ++i) {
    const worker_failure& f = options_.failures[i];
    if (std::find(device_of_stage_.begin(), device_of_stage_.end(), f.device) ==
        device_of_stage_.end()) {
      *error = "a worker failure names device " + std::to_string(f.device) +
               ", which hosts no stage of this job";
      return false;
    }
    schedule(f.at_s, event_kind::worker_fails, static_cast<int>(i));
  }
  std::vector<double> bandwidths;
  for (const link_model& link : cluster_.links) bandwidths.push_back(link.bandwidth);
  network_ = std::make_unique<network_model>(std::move(bandwidths));
  for (size_t i = 0; i < options_.degradations.size(); ++i) {
    const link_degradation& d = options_.degradations[i];
    if (d.link < 0 || d.link >= static_cast<int>(cluster_.links.size())) {
      *error = "a link degradation names link " + std::to_string(d.link) + " of " +
               std::to_string(cluster_.links.size());
      return false;
    }
    schedule(d.start_s, event_kind::degrade, static_cast<int>(2 * i));
    schedule(d.end_s, event_kind::degrade, static_cast<int>(2 * i + 1));
  }
  if (options_.trace_spans > 0) trace_ = std::make_unique<actors::trace_recorder>(actors_count);
  return true;
}

void simulator::schedule(double time, event_kind kind, int index) {
  events_.push(event{time, sequence_++, kind, generation_, index});
}

int simulator::new_parcel(parcel&& p) {
  if (free_parcels_.empty()) {
    parcels_.push_back(std::move(p));
    return static_cast<int>(parcels_.size() - 1);
  }
  const int id = free_parcels_.back();
  free_parcels_.pop_back();
  parcels_[id] = std::move(p);
  return id;
}

void simulator::send(int from_device, int target, stage_output&& content, int from_track,
                     double delay_s) {
  const int to_device = device_of_target(target);
  const double bytes = options_.header_bytes + payload_bytes(content.message);
  const auto& [path, latency_s] = route(from_device, to_device);
  const int id = new_parcel(parcel{generation_, target, from_track, from_device, now_ + delay_s,
                                   latency_s, std::move(content)});
  if (path.empty()) {
    schedule(now_ + delay_s + latency_s, event_kind::deliver, id);
    return;
  }
  if (delay_s > 0) {
    schedule(now_ + delay_s, event_kind::start_flow, id);
    return;
  }
  const uint64_t flow = network_->start(now_, path, bytes);
  flow_parcels_[flow] = id;
}

void simulator::start_flow(int id) {
  parcel& p = parcels_[id];
  if (p.generation != generation_) {  // sent before a failure: its sender's run is gone
    free_parcels_.push_back(id);
    return;
  }
  const auto& path = route(p.from_device, device_of_target(p.target)).first;
  const uint64_t flow =
      network_->start(now_, path, options_.header_bytes + payload_bytes(p.content.message));
  flow_parcels_[flow] = id;
}

void simulator::deliver(int id) {
  parcel& p = parcels_[id];
  if (p.generation != generation_) {  // sent before a failure: its sender's run is gone
    free_parcels_.push_back(id);
    return;
  }
  if (trace_ && spans_ < options_.trace_spans && !p.received) {
    trace_->flow(p.from_track, p.target, static_cast<int64_t>(p.content.message.key), p.sent_s,
                 now_);
  }
  if (p.target == coordinator && coordinator_pool_ >= 0) {
    pools_[coordinator_pool_].waiting.push_back(id);
    start_work(coordinator_pool_);
    return;
  }
  if (p.target == coordinator && !p.received) {
    // The coordinator is one thread: it takes the report off its inbox after what it is busy
    // with, at the cost of any end of a message.
    coordinator_free_s_ = std::max(now_, coordinator_free_s_) + message_end_s(p.content.message);
    if (coordinator_free_s_ > now_) {
      p.received = true;
      schedule(coordinator_free_s_, event_kind::deliver, id);
      return;
    }
  }
  if (p.target == coordinator) {
    stage_output report = std::move(p.content);
    free_parcels_.push_back(id);
    dispatch(run_->handle(report, now_));
    if (!run_->failure().empty()) {
      failure_ = run_->failure();
      return;
    }
    after_run_changed();
    return;
  }
  const int pool = devices_[device_of_stage_[p.target]].pool;
  pools_[pool].waiting.push_back(id);
  start_work(pool);
}

void simulator::start_work(int pool) {
  pool_state& queue = pools_[pool];
  if (queue.time_sliced) {
    advance_sliced(queue);
    for (auto next = queue.waiting.begin(); next != queue.waiting.end();) {
      const int id = *next;
      const int stage = parcels_[id].target;
      if (stage_at_work_[stage] || must_wait(id)) {
        ++next;
        continue;
      }
      next = queue.waiting.erase(next);
      sliced_work& sliced = sliced_[stage];
      sliced.work = handle(stage, device_of_stage_[stage], id);
      if (!failure_.empty()) return;
      sliced.remaining_s = sliced.work.seconds;
      sliced.started_s = now_;
      stage_at_work_[stage] = true;
      queue.working.push_back(stage);
    }
    // The stages with the next pass of their fixed order ready take their share too.
    for (size_t stage = 0; stage < stages_.size(); ++stage) {
      if (stage_at_work_[stage] || devices_[device_of_stage_[stage]].pool != pool ||
          !stages_[stage]->has_ready_work()) {
        continue;
      }
      sliced_work& sliced = sliced_[stage];
      sliced.work = run_ready_pass(static_cast<int>(stage));
      sliced.remaining_s = sliced.work.seconds;
      sliced.started_s = now_;
      stage_at_work_[stage] = true;
      queue.working.push_back(static_cast<int>(stage));
    }
    schedule_sliced(queue);
    return;
  }
  for (int device : queue.devices) {
    if (devices_[device].busy) continue;
    if (!take_next(device, queue)) begin_ready_work(device);
    if (!failure_.empty()) return;
  }
}

bool simulator::take_next(int device, pool_state& queue, int only_stage) {
  const auto next = next_ready(queue, only_stage);
  if (next == queue.waiting.end()) return false;
  const int id = *next;
  queue.waiting.erase(next);
  begin_work(device, id);
  return true;
}

std::deque<int>::iterator simulator::next_ready(pool_state& queue, int only_stage) {
  auto next = queue.waiting.end();
  for (auto it = queue.waiting.begin(); it != queue.waiting.end(); ++it) {
    const int stage = parcels_[*it].target;
    if (only_stage != any_stage && stage != only_stage) continue;
    if (stage == coordinator) {
      if (!coordinator_at_work_) return it;
      continue;
    }
    const actors::key_kind kind = parcels_[*it].content.message.kind;
    const bool forward = kind == actors::key_kind::forward;
    if (stage_at_work_[stage] || must_wait(*it)) continue;
    if (!backward_first_) return it;
    // 1F1B and its descendants: a backward (or step) goes before forwards that came earlier.
    if (!forward && kind != actors::key_kind::evaluate) return it;
    if (next == queue.waiting.end()) next = it;
  }
  return next;
}

bool simulator::must_wait(int id) const {
  const int stage = parcels_[id].target;
  const actors::key_kind kind = parcels_[id].content.message.kind;
  // Forwards wait for room (1F1B) and, with evaluations, for the replicas' gradient sum.
  return (kind == actors::key_kind::forward && !stages_[stage]->ready_for_forward()) ||
         (kind == actors::key_kind::evaluate && stages_[stage]->reducing());
}

charged_work simulator::handle(int stage, int device, int id) {
  const key_message message = std::move(parcels_[id].content.message);
  free_parcels_.push_back(id);
  std::string refusal;
  charged_work work;
  work.outputs = stages_[stage]->handle(message, &refusal);
  if (!refusal.empty()) {
    failure_ = "stage " + std::to_string(stage) + " refused a message: " + refusal;
    return work;
  }
  work.seconds = stage_devices_[stage]->take_charge() + message_cpu_s(&message, work.outputs);
  work.seconds = jittered(device, work.seconds);
  const device_state& state = devices_[device];
  if (state.straggle_probability > 0 &&
      std::uniform_real_distribution<double>(0, 1)(random_) < state.straggle_probability) {
    work.seconds *= state.slowdown;
  }
  stage_busy_s_[stage] += work.seconds;
  const int kind = static_cast<int>(message.kind);
  hash(&stage, sizeof stage);
  hash(&kind, sizeof kind);
  hash(&message.key, sizeof message.key);
  hash(&now_, sizeof now_);
  work.name = message.kind == actors::key_kind::evaluate   ? "evaluate"
              : message.kind == actors::key_kind::backward ? "backward"
              : stages_[stage]->is_last()                  ? "forward+backward"
                                                           : "forward";
  work.key = static_cast<int64_t>(message.key);
  return work;
}

void simulator::begin_work(int device, int id) {
  device_state& state = devices_[device];
  const int stage = parcels_[id].target;
  if (stage == coordinator) {
    begin_coordinator_work(device, id);
    return;
  }
  charged_work work = handle(stage, device, id);
  if (!failure_.empty()) return;
  state.outputs = std::move(work.outputs);
  state.busy = true;
  state.stage = stage;
  stage_at_work_[stage] = true;
  if (trace_ && spans_ < options_.trace_spans) {
    ++spans_;
    trace_->span(stage, work.name, work.key, now_, work.seconds);
  }
  schedule(now_ + work.seconds, event_kind::work_done, device);
}

double simulator::message_end_s(const key_message& message) const {
  return options_.message_cpu_s + options_.message_cpu_per_byte_s * payload_bytes(message);
}

double simulator::message_cpu_s(const key_message* incoming,
                                const std::vector<stage_output>& outputs) const {
  double seconds = incoming ? message_end_s(*incoming) : 0.0;
  for (const stage_output& output : outputs) seconds += message_end_s(output.message);
  return seconds;
}

double simulator::jittered(int device, double seconds) {
  const double spread = cluster_.devices[device].work_jitter;
  if (spread <= 0) return seconds;
  // Mean-preserving, as calibration's stage times are means.
  return seconds * std::lognormal_distribution<double>(-0.5 * spread * spread, spread)(random_);
}

charged_work simulator::run_ready_pass(int stage) {
  charged_work work;
  work.outputs = stages_[stage]->run_ready_work();
  work.seconds = jittered(device_of_stage_[stage], stage_devices_[stage]->take_charge() +
                                                       message_cpu_s(nullptr, work.outputs));
  stage_busy_s_[stage] += work.seconds;
  work.name = "scheduled";
  work.key = -1;
  return work;
}

void simulator::begin_ready_work(int device) {
  device_state& state = devices_[device];
  for (size_t stage = 0; stage < stages_.size(); ++stage) {
    if (stage_at_work_[stage] || devices_[device_of_stage_[stage]].pool != state.pool) continue;
    if (!stages_[stage]->has_ready_work()) continue;
    charged_work work = run_ready_pass(static_cast<int>(stage));
    state.outputs = std::move(work.outputs);
    state.busy = true;
    state.stage = static_cast<int>(stage);
    stage_at_work_[stage] = true;
    if (trace_ && spans_ < options_.trace_spans) {
      ++spans_;
      trace_->span(static_cast<int>(stage), work.name, work.key, now_, work.seconds);
    }
    schedule(now_ + work.seconds, event_kind::work_done, device);
    return;
  }
}

void simulator::finish_work(int device) {
  device_state& state = devices_[device];
  const int stage = state.stage;
  std::vector<stage_output> outputs = std::move(state.outputs);
  state.outputs.clear();
  state.busy = false;
  if (stage == coordinator) {
    coordinator_at_work_ = false;
    for (key_message& message : admitted_) {
      send(cluster_model::host_device, actors::entry_actor_of_key(config_, message.key),
           stage_output{stage_output::kind::to_next_stage, std::move(message)}, coordinator);
    }
    admitted_.clear();
  } else {
    stage_at_work_[stage] = false;
    send_outputs(device, stage, std::move(outputs));
  }
  // A stage actor on a shared scheduler thread keeps it while its mailbox holds mail (CAF
  // resumes an actor until its mailbox is empty): the device goes on with the same stage.
  pool_state& pool = pools_[state.pool];
  if (!pool.time_sliced) take_next(device, pool, stage);
  if (!failure_.empty()) return;
  start_work(state.pool);
  if (run_->checkpoint_due() && !writing_) begin_checkpoint();  // a stage may have settled
}

void simulator::advance_sliced(pool_state& pool) {
  if (!pool.working.empty()) {
    const double done = (now_ - pool.updated_s) * pool.sliced_rate();
    for (int stage : pool.working) {
      sliced_[stage].remaining_s = std::max(0.0, sliced_[stage].remaining_s - done);
    }
  }
  pool.updated_s = now_;
}

void simulator::schedule_sliced(pool_state& pool) {
  if (pool.working.empty()) return;
  const double rate = pool.sliced_rate();
  for (int stage : pool.working) {
    sliced_[stage].finish_sequence = sequence_;
    schedule(now_ + sliced_[stage].remaining_s / rate, event_kind::sliced_work_done, stage);
  }
}

void simulator::finish_sliced_work(int stage, uint64_t sequence) {
  sliced_work& sliced = sliced_[stage];
  if (!stage_at_work_[stage] || sliced.finish_sequence != sequence) return;  // rescheduled
  const int device = device_of_stage_[stage];
  pool_state& pool = pools_[devices_[device].pool];
  advance_sliced(pool);
  pool.working.erase(std::find(pool.working.begin(), pool.working.end(), stage));
  stage_at_work_[stage] = false;
  if (trace_ && spans_ < options_.trace_spans) {
    ++spans_;
    trace_->span(stage, sliced.work.name, sliced.work.key, sliced.started_s,
                 now_ - sliced.started_s);
  }
  send_outputs(device, stage, std::move(sliced.work.outputs));
  sliced.work.outputs.clear();
  start_work(devices_[device].pool);
  if (run_->checkpoint_due() && !writing_) begin_checkpoint();  // a stage may have settled
}

void simulator::send_outputs(int device, int stage, std::vector<stage_output>&& outputs) {
  for (stage_output& output : outputs) {
    int target = actors::destination_of(stage, output);
    if (target == actors::output_for_coordinator) target = coordinator;
    if (target == actors::output_for_replica_peer) {
      target = actors::replica_peer_of_actor(config_, stage);
    }
    send(device, target, std::move(output), stage);
  }
}

double simulator::admission_s(const key_message& message) const {
  const double per_sample = options_.profile ? options_.profile->coordinator_s_per_sample : 0;
  const double samples =
      message.payload.dims().empty() ? 0 : static_cast<double>(message.payload.dims()[0]);
  return per_sample * samples + message_end_s(message);
}

void simulator::dispatch(std::vector<key_message>&& messages) {
  for (key_message& message : messages) {
    // Stage 0 of the key's replica, once the coordinator has gathered and encoded its batch.
    const int first = actors::entry_actor_of_key(config_, message.key);
    coordinator_free_s_ = std::max(now_, coordinator_free_s_) + admission_s(message);
    send(cluster_model::host_device, first,
         stage_output{stage_output::kind::to_next_stage, std::move(message)}, coordinator,
         coordinator_free_s_ - now_);
  }
}

int simulator::shared_coordinator_pool() const {
  for (size_t d = 0; d < cluster_.devices.size(); ++d) {
    if (cluster_.devices[d].node != 0) continue;
    const int pool = devices_[d].pool;
    const pool_state& shared = pools_[pool];
    if (!cluster_.devices[d].pooled || shared.time_sliced) return -1;
    size_t stages_there = 0;
    for (int device : device_of_stage_) stages_there += devices_[device].pool == pool;
    // Stage actors no more than the cores run on threads of their own (actor_hosting.h).
    return stages_there > shared.devices.size() ? pool : -1;
  }
  return -1;
}

void simulator::begin_coordinator_work(int device, int id) {
  device_state& state = devices_[device];
  stage_output report = std::move(parcels_[id].content);
  free_parcels_.push_back(id);
  double seconds = message_end_s(report.message);
  std::vector<key_message> messages = run_->handle(report, now_);
  if (!run_->failure().empty()) {
    failure_ = run_->failure();
    return;
  }
  for (key_message& message : messages) {
    seconds += admission_s(message);
    admitted_.push_back(std::move(message));
  }
  state.busy = true;
  state.stage = coordinator;
  coordinator_at_work_ = true;
  if (trace_ && spans_ < options_.trace_spans) {
    ++spans_;
    trace_->span(coordinator, admitted_.empty() ? "report" : "admit",
                 static_cast<int64_t>(report.message.key), now_, seconds);
  }
  schedule(now_ + seconds, event_kind::work_done, device);
  after_run_changed();
}

void simulator::after_run_changed() {
  if (run_->checkpoint_due() && !writing_) begin_checkpoint();
  if (run_->finished()) finished_ = true;
}

std::unique_ptr<actors::training_run> simulator::new_run(
    std::optional<actors::run_progress> resume) {
  return std::make_unique<actors::training_run>(
      config_, data_.train, data_.test, options_.numerics ? *host_backend_ : shape_backend(),
      observer_, std::move(resume));
}

double simulator::storage_s() const {
  if (cluster_.storage_bandwidth <= 0) return 0;
  double bytes = 0;
  for (const auto& device : stage_devices_) bytes += device->cost().state_bytes();
  return cluster_.storage_latency_s + bytes / cluster_.storage_bandwidth;
}

void simulator::begin_checkpoint() {
  // A stage whose step waits for its replicas' sum (or whose weight average is under way) has
  // no final state yet: the round begins once its work, which follows, has settled it.
  for (const auto& stage : stages_) {
    if (stage->settling()) return;
  }
  if (!round_.begin_if_due(*run_, now_)) return;
  // Every stage answers at once: its state is in memory here, and writing the checkpoint takes
  // the storage's time.
  std::string problem;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const std::string shard = actors::serialize_stage_state(stages_[s]->save_state());
    if (round_.arrive(static_cast<int>(s), shard, &problem) ==
        actors::checkpoint_round::arrival::refused) {
      failure_ = "the checkpoint of step " + std::to_string(round_.step()) + ": " + problem;
      return;
    }
  }
  writing_ = checkpoint_image{run_->progress(now_), round_.take_states(), now_};
  const double seconds = storage_s();
  checkpoint_s_ += seconds;
  schedule(now_ + seconds, event_kind::checkpoint_written, 0);
}

void simulator::checkpoint_written() {
  latest_ = std::move(writing_);
  writing_.reset();
  ++checkpoints_;
  observer_.on_event({{"event", "checkpoint"},
                      {"step", latest_->progress.step},
                      {"epoch", latest_->progress.epoch},
                      {"virtual_s", now_}});
  dispatch(run_->checkpoint_done(now_));
  after_run_changed();
}

void simulator::worker_fails(int index) {
  if (finished_) return;
  const worker_failure& failure = options_.failures[index];
  const std::string& device = cluster_.devices[failure.device].name;
  nlohmann::json lost_stages = nlohmann::json::array();
  for (size_t s = 0; s < device_of_stage_.size(); ++s) {
    if (device_of_stage_[s] == failure.device) lost_stages.push_back(s);
  }
  const bool first_loss = !recovery_.under_way();
  nlohmann::json lost_event;
  std::string reason;
  if (!recovery_.lost({{"device", device}, {"virtual_s", now_}}, lost_stages, now_, &lost_event,
                      &reason)) {
    failure_ = "the worker on " + device + " (stages " + lost_stages.dump() + ") died at " +
               std::to_string(now_) + " s of virtual time, " + reason;
    return;
  }
  ++generation_;
  if (first_loss) {
    const actors::run_progress progress = run_->progress(now_);
    lost_steps_ += progress.step - (latest_ ? latest_->progress.step : 0);
  }
  for (pool_state& queue : pools_) {
    for (int id : queue.waiting) free_parcels_.push_back(id);
    queue.waiting.clear();
    queue.working.clear();
  }
  for (sliced_work& sliced : sliced_) sliced.work.outputs.clear();
  for (device_state& state : devices_) {
    state.busy = false;
    state.outputs.clear();
  }
  stage_at_work_.assign(stage_at_work_.size(), false);
  coordinator_at_work_ = false;
  admitted_.clear();
  writing_.reset();
  round_.abandon();
  observer_.on_event(lost_event);
  const double read_s = latest_ ? storage_s() : 0;
  schedule(now_ + options_.detection_s + options_.restart_s + read_s, event_kind::workers_rejoined,
           0);
}

void simulator::workers_rejoined() {
  recovery_s_ += now_ - recovery_.lost_at_s();
  // The new run's clocks go on from now: everything since the checkpoint (the start) was lost
  // and counts as training time, so samples/s is the rate of work kept.
  actors::run_progress resume = latest_ ? latest_->progress : actors::run_progress{};
  resume.wall_s = now_;
  resume.train_s += now_ - (latest_ ? latest_->taken_s : 0.0);
  run_ = new_run(resume);
  for (size_t s = 0; s < stages_.size(); ++s) {
    std::string problem;
    std::optional<actors::stage_state> saved;
    if (latest_) {
      const std::string& shard = latest_->shards[s];
      saved = actors::parse_stage_state(shard.data(), shard.size(), &problem);
    }
    const actors::stage_state& state = saved ? *saved : initial_states_[s];
    if ((latest_ && !saved) || !stages_[s]->load_state(state, false, &problem)) {
      failure_ = "stage " + std::to_string(s) + " cannot load its checkpoint: " + problem;
      return;
    }
  }
  observer_.on_event(recovery_.recovered(resume.step, now_));
  dispatch(run_->start(now_));
  after_run_changed();
}

const std::pair<std::vector<int>, double>& simulator::route(int from, int to) {
  const uint64_t span = cluster_.devices.size() + 1;
  const uint64_t key = static_cast<uint64_t>(from + 1) * span + static_cast<uint64_t>(to + 1);
  auto found = routes_.find(key);
  if (found == routes_.end()) {
    std::vector<int> links = cluster_.path(from, to);
    const double latency_s = cluster_.path_latency_s(links);
    found = routes_.emplace(key, std::make_pair(std::move(links), latency_s)).first;
  }
  return found->second;
}

void simulator::degrade(int index) {
  const link_degradation& d = options_.degradations[index / 2];
  network_->set_bandwidth_factor(d.link, index % 2 == 0 ? d.factor : 1.0, now_);
}

bool simulator::run(std::string* error) {
  dispatch(run_->start(0));
  after_run_changed();
  while (!finished_ && failure_.empty()) {
    const std::optional<double> flow_done = network_->next_finish();
    if (flow_done && (events_.empty() || *flow_done < events_.top().time)) {
      now_ = std::max(now_, *flow_done);
      ++events_handled_;
      for (uint64_t flow : network_->advance(now_)) {
        auto found = flow_parcels_.find(flow);
        const int id = found->second;
        flow_parcels_.erase(found);
        schedule(now_ + parcels_[id].latency_s, event_kind::deliver, id);
      }
      continue;
    }
    if (events_.empty()) {
      *error = "the simulated pipeline stalled at " + std::to_string(now_) +
               " s with nothing left to do";
      return false;
    }
    const event next = events_.top();
    events_.pop();
    now_ = next.time;
    ++events_handled_;
    const bool stale = next.generation != generation_;
    switch (next.kind) {
      case event_kind::deliver:
        deliver(next.index);
        break;
      case event_kind::work_done:
        if (!stale) finish_work(next.index);
        break;
      case event_kind::sliced_work_done:
        if (!stale) finish_sliced_work(next.index, next.sequence);
        break;
      case event_kind::degrade:
        degrade(next.index);
        break;
      case event_kind::checkpoint_written:
        if (!stale) checkpoint_written();
        break;
      case event_kind::worker_fails:
        worker_fails(next.index);
        break;
      case event_kind::workers_rejoined:
        if (!stale) workers_rejoined();
        break;
      case event_kind::start_flow:
        start_flow(next.index);
        break;
    }
  }
  if (!failure_.empty()) {
    *error = failure_;
    return false;
  }
  return true;
}

simulation_result simulator::result() {
  simulation_result result;
  result.summary = run_->summary();
  result.virtual_s = now_;
  for (double busy : stage_busy_s_) {
    const double utilization = now_ > 0 ? busy / now_ : 0;
    result.stage_utilization.push_back(utilization);
    result.stage_idle_fraction.push_back(1 - utilization);
  }
  const std::vector<double>& carried = network_->carried_bytes();
  for (size_t l = 0; l < carried.size(); ++l) {
    if (carried[l] <= 0) continue;
    result.link_names.push_back(cluster_.links[l].name);
    result.link_utilization.push_back(now_ > 0 ? carried[l] / (cluster_.links[l].bandwidth * now_)
                                               : 0);
  }
  for (const auto& stage : stages_) {
    const std::vector<int64_t>& histogram = stage->staleness_histogram();
    result.stage_staleness_histograms.push_back(histogram);
    if (result.staleness_histogram.size() < histogram.size()) {
      result.staleness_histogram.resize(histogram.size(), 0);
    }
    for (size_t i = 0; i < histogram.size(); ++i) result.staleness_histogram[i] += histogram[i];
  }
  std::vector<int> used;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const int device = device_of_stage_[s];
    auto at = std::find(used.begin(), used.end(), device);
    if (at == used.end()) {
      used.push_back(device);
      result.device_names.push_back(cluster_.devices[device].name);
      result.device_peak_bytes.push_back(0);
      result.device_memory_bytes.push_back(cluster_.devices[device].memory_bytes);
      at = used.end() - 1;
    }
    // Peaks of the device's stages added: an upper bound when they peak at different times.
    result.device_peak_bytes[at - used.begin()] += stage_devices_[s]->peak_bytes();
  }
  result.checkpoints = checkpoints_;
  result.checkpoint_s = checkpoint_s_;
  result.restarts = recovery_.restarts();
  result.recovery_s = recovery_s_;
  result.lost_steps = lost_steps_;
  result.events = events_handled_;
  result.trace_hash = XXH3_64bits_digest(hash_);
  result.trace = std::move(trace_);
  return result;
}

}  // namespace

std::optional<simulation_result> simulate(const actors::job_config& config,
                                          const actors::job_data& data,
                                          const cluster_model& cluster,
                                          const simulation_options& options,
                                          actors::training_observer& observer, std::string* error) {
  simulator host(config, data, cluster, options, observer);
  if (!host.build(error) || !host.run(error)) return std::nullopt;
  return host.result();
}

}  // namespace troupe::sim
