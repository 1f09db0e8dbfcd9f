// The simulator's checkpoints and recovery: a checkpoint's states taken when the pipeline is
// quiet and written in the storage's time; a failed worker's keys and work lost, and every
// stage reloaded from the latest checkpoint when its replacement joins.

#include <nlohmann/json.hpp>

#include "sim/shape_backend.h"
#include "sim/simulator.h"

namespace troupe::sim::internal {

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

}  // namespace troupe::sim::internal
