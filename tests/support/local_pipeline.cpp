#include "tests/support/local_pipeline.h"

#include <algorithm>

#include "actors/engine/partition.h"
#include "actors/engine/stage_settings.h"
#include "layers/backend_registry.h"
#include "layers/check.h"

namespace troupe::actors {

local_pipeline::local_pipeline(const job_config& config, layers::backend& device,
                               int64_t train_samples, int64_t total_steps, uint64_t order_seed)
    : config_(config),
      backend_(device),
      total_steps_(total_steps),
      order_(order_seed),
      shuffled_(order_seed != 0),
      batches_(train_samples, config.training.batch_size, config.training.seed, config.data.shuffle,
               true) {
  std::string error;
  auto ranges = partition_model(config, &error);
  TROUPE_CHECK(ranges.has_value());
  const int64_t per_epoch = batches_.batches_per_epoch();
  std::vector<std::shared_ptr<pass_turn>> turns;
  for (int actor = 0; actor < stage_actor_count(config); ++actor) {
    const int stage = stage_of_actor(config, actor);
    if (stage == 0) turns = make_pass_turns(config);  // each replica's own
    devices_.push_back(make_layers_stage_device(config, (*ranges)[stage], device));
    stages_.push_back(
        std::make_unique<stage_logic>(stage_settings_of(config, stage, per_epoch, total_steps,
                                                        turns, replica_of_actor(config, actor)),
                                      *devices_.back()));
  }
  mailboxes_.resize(stages_.size());
}

key_message local_pipeline::make_forward(const layers::dataset& data, const admission& entry) {
  const int64_t batch = config_.training.batch_size;
  const int64_t per_epoch = batches_.batches_per_epoch();
  const int64_t epoch = entry.step / per_epoch;
  if (epoch != current_epoch_) {
    batches_.start_epoch(epoch);
    current_epoch_ = epoch;
  }
  const int64_t micro = micro_batch_size(config_);
  const int64_t first = (entry.step % per_epoch) * batch + entry.sample_offset;
  if (data.instances) {
    // A dynamic model's key: its instances, assembled as the coordinator does.
    std::vector<int64_t> samples(batches_.order().begin() + first,
                                 batches_.order().begin() + first + micro);
    key_message message =
        batch_message(key_kind::forward, entry.key, samples, data, backend_, config_.data.padding);
    message.step = entry.step;
    message.sample_offset = entry.sample_offset;
    message.replica_floor = entry.replica_floor;
    return message;
  }
  const int64_t size = data.sample_size();
  std::vector<float> features(micro * size);
  const int64_t per_sample = data.labels_per_sample;
  auto labels = std::make_shared<std::vector<int32_t>>(micro * per_sample);
  for (int64_t i = 0; i < micro; ++i) {
    const int64_t sample = batches_.order()[first + i];
    std::copy_n(data.features.begin() + sample * size, size, features.begin() + i * size);
    std::copy_n(data.labels.begin() + sample * per_sample, per_sample,
                labels->begin() + i * per_sample);
  }
  layers::shape dims{micro};
  dims.insert(dims.end(), data.sample_shape.begin(), data.sample_shape.end());
  key_message message;
  message.kind = key_kind::forward;
  message.key = entry.key;
  message.step = entry.step;
  message.sample_offset = entry.sample_offset;
  message.replica_floor = entry.replica_floor;
  message.payload = layers::tensor::from_host(backend_, backend_.default_stream(), dims, features);
  message.labels = labels;
  return message;
}

void local_pipeline::admit(const layers::dataset& data, admission_policy& coordinator) {
  for (const admission& entry : coordinator.admit()) {
    mailboxes_[entry.replica * config_.parallelism.stages].forwards.push_back(
        make_forward(data, entry));
  }
  peak_active_ = std::max(peak_active_, coordinator.active());
}

bool local_pipeline::next_delivery(int* stage, channel* from) {
  std::vector<std::pair<int, channel>> ready;
  for (int s = 0; s < stage_count(); ++s) {
    if (!mailboxes_[s].backwards.empty()) ready.push_back({s, channel::backward});
    if (!mailboxes_[s].chunks.empty()) ready.push_back({s, channel::chunk});
    if (!mailboxes_[s].forwards.empty() && stages_[s]->ready_for_forward()) {
      ready.push_back({s, channel::forward});
    }
    if (stages_[s]->has_ready_work()) ready.push_back({s, channel::ready_pass});
  }
  if (ready.empty()) return false;
  const size_t pick = static_cast<size_t>(order_.below(ready.size()));
  *stage = ready[pick].first;
  *from = ready[pick].second;
  return true;
}

key_message local_pipeline::take(int stage, channel from) {
  auto& queue = from == channel::backward ? mailboxes_[stage].backwards
                : from == channel::chunk  ? mailboxes_[stage].chunks
                                          : mailboxes_[stage].forwards;
  key_message message = std::move(queue.front());
  queue.pop_front();
  return message;
}

bool local_pipeline::deliver(const coordinator_inbox& to_coordinator) {
  const bool delivered = deliver_one(to_coordinator);
  if (delivered && after_delivery) after_delivery();
  return delivered;
}

bool local_pipeline::deliver_one(const coordinator_inbox& to_coordinator) {
  if (shuffled_) {
    int stage = 0;
    channel from = channel::forward;
    if (!next_delivery(&stage, &from)) return false;
    route(stage,
          from == channel::ready_pass ? stages_[stage]->run_ready_work()
                                      : stages_[stage]->handle(take(stage, from)),
          to_coordinator);
    return true;
  }
  // Every stage with work handles one message, backward first, as stages running side by
  // side at equal speed would; what they send arrives in the next round. A stage with the next
  // pass of its zero-bubble order ready runs that, as its host does.
  std::vector<std::pair<int, std::vector<stage_output>>> sent;
  for (int s = 0; s < stage_count(); ++s) {
    if (stages_[s]->has_ready_work()) {
      sent.push_back({s, stages_[s]->run_ready_work()});
      continue;
    }
    if (!mailboxes_[s].chunks.empty()) {
      sent.push_back({s, stages_[s]->handle(take(s, channel::chunk))});
      continue;
    }
    const bool backward = !mailboxes_[s].backwards.empty();
    if (!backward && (mailboxes_[s].forwards.empty() || !stages_[s]->ready_for_forward())) continue;
    sent.push_back(
        {s, stages_[s]->handle(take(s, backward ? channel::backward : channel::forward))});
  }
  for (auto& [stage, outputs] : sent) route(stage, std::move(outputs), to_coordinator);
  return !sent.empty();
}

void local_pipeline::route(int stage, std::vector<stage_output> outputs,
                           const coordinator_inbox& to_coordinator) {
  // Tensors go to the next stage as they are, though it works on a stream of its own: every
  // stage_device call returns with its stream drained, so they are finished, and the memory
  // the stage freed meanwhile is no longer in use when another stage's stream gets it.
  for (stage_output& output : outputs) {
    const int target = destination_of(stage, output);
    if (target == output_for_coordinator) {
      to_coordinator(std::move(output));
    } else if (target == output_for_replica_peer) {
      mailboxes_[replica_peer_of_actor(config_, stage)].chunks.push_back(std::move(output.message));
    } else {
      auto& queue = target > stage ? mailboxes_[target].forwards : mailboxes_[target].backwards;
      queue.push_back(std::move(output.message));
    }
  }
}

std::vector<std::vector<float>> local_pipeline::weights() {
  std::vector<std::vector<float>> result;
  for (auto& device : devices_) {
    for (layers::parameter* p : device->parameters()) {
      result.push_back(p->value.to_host(backend_.default_stream()));
    }
  }
  return result;
}

pipeline_totals local_pipeline::train(const layers::dataset& data, int64_t steps) {
  TROUPE_CHECK(steps_done_ + steps <= total_steps_);
  admission_settings settings = admission_settings::of(config_, steps_done_ + steps);
  settings.first_step = steps_done_;
  admission_policy coordinator(settings);
  pipeline_totals totals;
  const coordinator_inbox to_coordinator = [&](stage_output&& output) {
    if (output.what == stage_output::kind::retired) coordinator.retired(output.message.key);
    if (output.what != stage_output::kind::loss_report) return;
    totals.loss_sum += output.loss_sum;
    totals.correct += output.correct;
    totals.samples += output.samples;
  };
  admit(data, coordinator);
  while (deliver(to_coordinator)) admit(data, coordinator);
  TROUPE_CHECK(coordinator.finished());
  steps_done_ += steps;
  return totals;
}

training_summary local_pipeline::run(const job_data& data, clock_source& clock,
                                     training_observer& observer) {
  std::string error;
  auto host = layers::create_backend("cpu", 1, &error);
  TROUPE_CHECK(host != nullptr);
  training_run coordinator(config_, data.train, data.test, *host, observer);
  const auto to_stage_0 = [this](std::vector<key_message> messages) {
    for (key_message& message : messages) {
      const int first = entry_actor_of_key(config_, message.key);
      mailboxes_[first].forwards.push_back(std::move(message));
    }
  };
  const coordinator_inbox to_coordinator = [&](stage_output&& output) {
    to_stage_0(coordinator.handle(output, clock.now_seconds()));
  };
  to_stage_0(coordinator.start(clock.now_seconds()));
  while (!coordinator.finished() && coordinator.failure().empty()) {
    if (coordinator.checkpoint_due()) {
      to_stage_0(coordinator.checkpoint_done(clock.now_seconds()));
    } else if (!deliver(to_coordinator)) {
      break;
    }
  }
  TROUPE_CHECK(coordinator.finished());
  return coordinator.summary();
}

}  // namespace troupe::actors
