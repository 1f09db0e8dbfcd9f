#include "sim/simulation.h"

#include <xxhash.h>

#include <algorithm>
#include <set>

#include "actors/engine/partition.h"
#include "actors/engine/stage_settings.h"
#include "layers/backend_registry.h"
#include "layers/model.h"
#include "sim/simulator.h"
#include "sim/stage_devices.h"

namespace troupe::sim {
namespace internal {

/// Bytes of a message's payload and labels (its frames after the header).
double payload_bytes(const key_message& message) {
  double bytes = 0;
  if (!message.payload.empty()) bytes += 4.0 * static_cast<double>(message.payload.size());
  if (message.labels) bytes += 4.0 * static_cast<double>(message.labels->size());
  bytes += 4.0 * static_cast<double>(message.values.count);  // a ring all-reduce's piece
  if (message.instances) {
    // A dynamic model's instances travel along: each part's token, parent and label.
    for (const layers::instance& item : *message.instances) {
      bytes +=
          4.0 * static_cast<double>(item.tokens.size() + item.parent.size() + item.labels.size());
    }
  }
  return bytes;
}

bool simulator::build(std::string* error) {
  auto ranges = actors::partition_model(config_, error);
  if (!ranges) return false;
  auto maker = stage_device_maker::make(config_, options_.profile, error);
  if (!maker) return false;
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
  backward_first_ = actors::backward_first(config_);
  replicated_ = config_.parallelism.replicas > 1;
  summed_in_group_ = replicated_ && config_.parallelism.collective != actors::collective_kind::ring;
  group_in_memory_ =
      replicated_ && config_.parallelism.collective == actors::collective_kind::shared_memory;
  // The interleaved schedule places stage s on worker s % workers, its device; replica r's
  // workers follow replica r − 1's.
  const bool interleaved = config_.parallelism.schedule == actors::pipeline_schedule::interleaved &&
                           cluster_.placement.size() != static_cast<size_t>(actors_count);
  const int workers = interleaved ? stages / config_.parallelism.virtual_stages : stages;
  const int replicas = config_.parallelism.replicas;
  std::vector<std::shared_ptr<actors::pass_turn>> turns;
  std::vector<std::set<int>> processes_of_pool(pools_.size());  // workers' indices
  for (int actor = 0; actor < actors_count; ++actor) {
    const int s = actors::stage_of_actor(config_, actor);
    const int replica = actors::replica_of_actor(config_, actor);
    if (s == 0) turns = actors::make_pass_turns(config_);  // each replica's own
    const int worker = replica * workers + s % workers;    // its process
    const int device = cluster_.device_of_stage(worker, replicas * workers, error);
    if (device < 0) return false;
    device_of_stage_.push_back(device);
    processes_of_pool[devices_[device].pool].insert(worker);
    std::unique_ptr<actors::stage_device> numerics;
    if (options_.numerics) {
      backends_.push_back(layers::create_backend("cpu", actors::threads_per_stage(config_), error));
      if (!backends_.back()) return false;
      numerics = actors::make_layers_stage_device(config_, (*ranges)[s], *backends_.back());
    }
    stage_devices_.push_back(
        maker->stage((*ranges)[s], cluster_.devices[device], std::move(numerics)));
    if (group_in_memory_) stage_devices_.back()->sum_in_shared_memory(replicas);
    stages_.push_back(std::make_unique<actors::stage_logic>(
        actors::stage_settings_of(config_, s, run_->steps_per_epoch(), run_->total_steps(), turns,
                                  replica),
        *stage_devices_.back()));
  }
  for (size_t p = 0; p < pools_.size(); ++p) pools_[p].processes = processes_of_pool[p].size();
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
  if (group_in_memory_ && content.message.kind == actors::key_kind::reduce) {
    // A shared-memory group's pieces stay in the process's memory: no link, no latency.
    const int id = new_parcel(parcel{generation_, target, from_track, from_device, now_ + delay_s,
                                     0, std::move(content)});
    schedule(now_ + delay_s, event_kind::deliver, id);
    return;
  }
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

}  // namespace internal

std::optional<simulation_result> simulate(const actors::job_config& config,
                                          const actors::job_data& data,
                                          const cluster_model& cluster,
                                          const simulation_options& options,
                                          actors::training_observer& observer, std::string* error) {
  internal::simulator host(config, data, cluster, options, observer);
  if (!host.build(error) || !host.run(error)) return std::nullopt;
  return host.result();
}

}  // namespace troupe::sim
