// The simulator's devices and their work: each device, or each pool of a node's devices, takes
// waiting messages in arrival order (a backward first where the schedule says so, a replica's
// ring chunk before its stage's other messages), one per stage at a time, as a stage actor
// handles one message at a time; a stage whose replica group (shared memory, NCCL) is summing
// takes nothing else until the sum is done; a pool that hosts more stage actors than devices
// also runs the coordinator's turns; a time-sliced pool shares its devices among the stages at
// work.

#include <algorithm>

#include "actors/engine/stage_settings.h"
#include "sim/simulator.h"

namespace troupe::sim::internal {

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
  const auto next = next_for_a_stage(queue, only_stage);
  if (!replicated_ || next == queue.waiting.end() || parcels_[*next].target == coordinator) {
    return next;
  }
  // A stage takes a replica's ring chunk before its other messages, as its host does.
  const int stage = parcels_[*next].target;
  for (auto it = queue.waiting.begin(); it != queue.waiting.end(); ++it) {
    if (parcels_[*it].target == stage &&
        parcels_[*it].content.message.kind == actors::key_kind::reduce) {
      return it;
    }
  }
  return next;
}

std::deque<int>::iterator simulator::next_for_a_stage(pool_state& queue, int only_stage) {
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
  // A group's collective holds its stage until every rank has come (lock-step): while its sum
  // or average is under way the stage takes nothing but the collective's pieces.
  if (summed_in_group_ && kind != actors::key_kind::reduce && stages_[stage]->settling()) {
    return true;
  }
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
  work.name = message.kind == actors::key_kind::reduce     ? "reduce"
              : message.kind == actors::key_kind::evaluate ? "evaluate"
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
  // A replica group (NCCL, shared memory) sums on the devices: no message to encode or take.
  if (summed_in_group_ && message.kind == actors::key_kind::reduce) return 0;
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
  // A dynamic model's key gathers its instances (its payload's rows are their parts).
  const double samples = message.instances ? static_cast<double>(message.instances->size())
                         : message.payload.dims().empty()
                             ? 0
                             : static_cast<double>(message.payload.dims()[0]);
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

}  // namespace troupe::sim::internal
