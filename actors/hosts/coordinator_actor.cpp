// The coordinator actor: admits keys through the training_run, drives the checkpoint rounds
// with every stage actor, and commits checkpoints (one shard per stage, the replicas merged).

#include <cstdio>

#include "actors/config/job_file.h"
#include "actors/engine/stage_settings.h"
#include "actors/engine/stage_state.h"
#include "actors/hosts/actor_hosting.h"
#include "actors/hosts/wire_format.h"
#include "layers/backend_registry.h"

namespace troupe::actors {

/// The actor to tell of a message sent to stage `stage` (null where a receiver thread delivers).
static caf::actor reader_of(const coordinator_parts& parts, size_t stage) {
  return stage < parts.stage_readers.size() ? parts.stage_readers[stage] : caf::actor{};
}

static void dispatch(coordinator_parts& parts, const std::vector<key_message>& messages) {
  for (const key_message& message : messages) {
    // Stage 0 of the key's replica.
    const int first = entry_actor_of_key(*parts.config, message.key);
    wire_route route{parts.job_id, transport::coordinator_stage, first, 0,
                     parts.clock->now_seconds()};
    send_on(*parts.stages[first], to_wire(message, route), reader_of(parts, first));
  }
}

/// Asks every stage to save its state (save rounds) or load its shard (load rounds) for the
/// round that has just begun.
static void ask_stages(coordinator_parts& parts) {
  const bool load = parts.round.current() == checkpoint_round::purpose::load;
  for (size_t s = 0; s < parts.stages.size(); ++s) {
    wire_route route{parts.job_id, transport::coordinator_stage, static_cast<int32_t>(s), 0,
                     parts.clock->now_seconds()};
    const transport::message_kind kind = !load ? transport::message_kind::save_state
                                         : parts.initial_weights_only
                                             ? transport::message_kind::load_weights
                                             : transport::message_kind::load_state;
    // Every replica of a stage loads the checkpoint's one shard of it.
    const auto shard =
        load ? parts.initial_shards[stage_of_actor(*parts.config, static_cast<int>(s))] : nullptr;
    send_on(*parts.stages[s], state_to_wire(kind, parts.round.step(), shard, route),
            reader_of(parts, s));
  }
}

/// Starts a checkpoint round when the run has reached one; otherwise does nothing.
static void maybe_checkpoint(coordinator_parts& parts) {
  if (parts.round.under_way() || !parts.run->checkpoint_due()) return;
  const double now = parts.clock->now_seconds();
  if (parts.store == nullptr) {
    dispatch(parts, parts.run->checkpoint_done(now));
    return;
  }
  parts.round.begin(checkpoint_round::purpose::save, *parts.run->checkpoint_due(), now);
  ask_stages(parts);
}

static void after_run_changed(caf::event_based_actor* self, coordinator_parts& parts) {
  maybe_checkpoint(parts);
  if (parts.monitor) {
    // A checkpoint round waits for the stages as keys in flight do.
    parts.monitor->note_coordinator(
        parts.clock->now_seconds(),
        parts.run->keys_in_flight() + (parts.round.under_way() ? 1 : 0));
  }
  if (parts.run->finished()) self->send(parts.listener, done_atom::value);
}

/// Writes the checkpoint whose shards have all arrived, then lets the run go on.
static void commit_checkpoint(coordinator_parts& parts) {
  const double now = parts.clock->now_seconds();
  const int64_t step = *parts.run->checkpoint_due();
  checkpoint_manifest manifest;
  manifest.job = parts.job_name;
  manifest.config_hash = parts.config_hash;
  manifest.step = step;
  const run_progress progress = parts.run->progress(now);
  manifest.epoch = progress.epoch;
  manifest.stages = parts.config->parallelism.stages;
  manifest.coordinator = to_json(progress);
  std::string error;
  std::vector<std::string> shards =
      merge_replica_states(parts.round.take_states(), parts.config->parallelism.stages, &error);
  if (shards.empty()) {
    std::fprintf(stderr, "troupe: the checkpoint of step %lld was not written: %s\n",
                 static_cast<long long>(step), error.c_str());
    return;
  }
  uint64_t bytes = 0;
  for (const std::string& shard : shards) bytes += shard.size();
  if (parts.store->commit(manifest, shards, &error)) {
    const double seconds = parts.clock->now_seconds() - parts.round.started_s();
    if (parts.observer) {
      parts.observer->on_event(
          {{"event", "checkpoint"},
           {"step", step},
           {"epoch", progress.epoch},
           {"wall_s", progress.wall_s},
           {"bytes", bytes},
           {"seconds", seconds},
           {"directory", parts.store->root() + "/step-" + std::to_string(step)}});
    }
  } else {
    std::fprintf(stderr, "troupe: the checkpoint of step %lld was not written: %s\n",
                 static_cast<long long>(step), error.c_str());
  }
}

/// The run cannot go on: says why once and tells the listener.
static void fail_run(caf::event_based_actor* self, coordinator_parts& parts,
                     const std::string& why) {
  if (parts.failure.empty()) parts.failure = why;
  self->send(parts.listener, done_atom::value);
}

/// A stage's answer to a save or load round.
static void handle_state_answer(caf::event_based_actor* self, coordinator_parts& parts,
                                const transport::message& incoming) {
  const int stage = incoming.header.source_stage;
  std::string error;
  auto bytes = state_from_wire(incoming, &error);
  const bool loading = parts.round.current() == checkpoint_round::purpose::load;
  if (incoming.header.kind == transport::message_kind::state_refused) {
    error = incoming.header.text;
    bytes.reset();
  } else if (bytes && loading != (incoming.header.kind == transport::message_kind::state_loaded)) {
    bytes.reset();  // a shard during a load round, or an acknowledgement during a save round
  }
  const bool was_under_way = parts.round.under_way();
  std::string problem;
  const auto arrival = bytes ? parts.round.arrive(stage, std::move(*bytes), &problem)
                             : checkpoint_round::arrival::refused;
  if (arrival == checkpoint_round::arrival::waiting) return;
  if (arrival == checkpoint_round::arrival::refused) {
    // An answer no round waits for is ignored; a bad one ends the round and the run.
    if (!was_under_way || (bytes && parts.round.under_way())) {
      std::fprintf(stderr, "troupe: coordinator ignored %s\n",
                   problem.empty() ? ("a state message from stage " + std::to_string(stage)).c_str()
                                   : problem.c_str());
      return;
    }
    parts.round.abandon();
    if (!error.empty()) problem = error;
    if (problem.empty()) problem = "stage " + std::to_string(stage) + " sent a bad state";
    fail_run(self, parts, problem);
    return;
  }
  const double now = parts.clock->now_seconds();
  if (loading) {
    parts.initial_shards.clear();
    dispatch(parts, parts.run->start(now));
  } else {
    commit_checkpoint(parts);
    dispatch(parts, parts.run->checkpoint_done(now));
  }
  after_run_changed(self, parts);
}

static void on_coordinator_message(caf::event_based_actor* self, coordinator_parts& parts,
                                   const transport::message& incoming) {
  if (incoming.header.job_id != parts.job_id) return;  // an earlier generation's
  const auto kind = incoming.header.kind;
  if (kind == transport::message_kind::stage_state ||
      kind == transport::message_kind::state_loaded ||
      kind == transport::message_kind::state_refused) {
    handle_state_answer(self, parts, incoming);
    return;
  }
  const double start = parts.clock->now_seconds();
  std::string error;
  auto report = report_from_wire(incoming, &error);
  if (!report) {
    std::fprintf(stderr, "troupe: coordinator dropped a message from stage %d: %s\n",
                 incoming.header.source_stage, error.c_str());
    return;
  }
  const std::vector<key_message> admitted = parts.run->handle(*report, start);
  dispatch(parts, admitted);
  if (parts.trace) {
    // The coordinator's turn on a report (admission, the batches' assembly and their sends),
    // and the report's arrow where the stage shares the coordinator's clock (one process: the
    // coordinator has an inbox of its own).
    const int64_t key = static_cast<int64_t>(incoming.header.key);
    if (parts.inbox) {
      parts.trace->flow(incoming.header.source_stage, transport::coordinator_stage, key,
                        sent_time(incoming), start);
    }
    parts.trace->span(transport::coordinator_stage, admitted.empty() ? "report" : "admit", key,
                      start, parts.clock->now_seconds() - start);
  }
  if (!parts.run->failure().empty()) {
    if (parts.failure.empty()) {
      parts.failure = parts.run->failure();
      self->send(parts.listener, done_atom::value);
    }
    return;
  }
  after_run_changed(self, parts);
}

caf::behavior coordinator_actor(caf::stateful_actor<coordinator_actor_state>* self,
                                std::shared_ptr<coordinator_parts> parts) {
  exit_when_out_of_memory(self, "the coordinator");
  self->state.parts = std::move(parts);
  return {
      [self](start_atom) {
        coordinator_parts& parts = *self->state.parts;
        if (!parts.initial_shards.empty()) {
          parts.round.begin(checkpoint_round::purpose::load, 0, parts.clock->now_seconds());
          ask_stages(parts);
          return;
        }
        dispatch(parts, parts.run->start(parts.clock->now_seconds()));
        after_run_changed(self, parts);
      },
      [self](checkpoint_atom, bool stop_after) {
        coordinator_parts& parts = *self->state.parts;
        parts.run->request_checkpoint(stop_after);
      },
      [self](const transport::message& incoming) {
        on_coordinator_message(self, *self->state.parts, incoming);
      },
      [self](status_atom, const std::string& report) {
        coordinator_parts& parts = *self->state.parts;
        if (parts.observer) parts.observer->on_event(nlohmann::json::parse(report));
      },
      [self](take_atom) {
        coordinator_parts& parts = *self->state.parts;
        take_and_handle(self, parts.inbox, parts.dropped_frames,
                        [self, &parts](const transport::message& incoming) {
                          on_coordinator_message(self, parts, incoming);
                        });
      },
  };
}

std::shared_ptr<coordinator_parts> make_coordinator_parts(const job_config& config,
                                                          const job_data& data,
                                                          const pipeline_options& options,
                                                          training_observer& observer,
                                                          clock_source& clock, std::string* error) {
  auto parts = std::make_shared<coordinator_parts>();
  parts->host = layers::create_backend("cpu", 1, error);
  if (!parts->host) return nullptr;
  std::optional<run_progress> progress;
  if (options.resume) {
    const loaded_checkpoint& checkpoint = *options.resume;
    if (checkpoint.manifest.stages != config.parallelism.stages) {
      *error = checkpoint.directory + " holds " + std::to_string(checkpoint.manifest.stages) +
               " stages; the job has " + std::to_string(config.parallelism.stages);
      return nullptr;
    }
    progress = progress_from_json(checkpoint.manifest.coordinator, error);
    if (!progress) {
      *error = checkpoint.directory + "/manifest.json: " + *error;
      return nullptr;
    }
    for (const std::string& shard : checkpoint.shards) {
      parts->initial_shards.push_back(std::make_shared<const std::string>(shard));
    }
  } else if (!options.initial_weights.empty()) {
    parts->initial_shards = options.initial_weights;
    parts->initial_weights_only = true;
  }
  parts->config = &config;
  parts->round = checkpoint_round(stage_actor_count(config));
  parts->run = std::make_unique<training_run>(config, data.train, data.test, *parts->host, observer,
                                              progress);
  parts->clock = &clock;
  parts->trace = options.trace;
  parts->monitor = options.monitor;
  parts->observer = &observer;
  parts->job_name = options.job_name;
  parts->config_hash = checkpoint_config_hash(config);
  if (!options.checkpoint_directory.empty()) {
    parts->store = std::make_unique<checkpoint_store>(options.checkpoint_directory,
                                                      config.checkpoint.keep_last);
  }
  return parts;
}

void forward_checkpoint_request(caf::scoped_actor& self, const caf::actor& coordinator,
                                std::atomic<int>* requests) {
  if (requests == nullptr) return;
  const int request = requests->exchange(0);
  if (request != 0) self->send(coordinator, checkpoint_atom::value, request == 2);
}

void watch_run(caf::scoped_actor& self, const caf::actor& coordinator,
               const pipeline_options& options, double stall_timeout_s, clock_source& clock) {
  if (options.monitor == nullptr) return;
  const double now = clock.now_seconds();
  const bool asked = options.status_requests && options.status_requests->exchange(false);
  const bool stalled = options.monitor->stall_began(now, stall_timeout_s);
  if (!asked && !stalled) return;
  const nlohmann::json report = options.monitor->status_report(stalled ? "stall" : "status", now);
  // Printed here: the coordinator may be the one that is stuck.
  std::fprintf(stderr, "troupe: %s", describe_status(report).c_str());
  self->send(coordinator, status_atom::value, report.dump());
}

void await_run(caf::scoped_actor& self, const caf::actor& coordinator,
               const pipeline_options& options, double stall_timeout_s, clock_source& clock) {
  bool done = false;
  while (!done) {
    self->receive([&](done_atom) { done = true; },
                  caf::after(std::chrono::milliseconds(100)) >> [] {});
    forward_checkpoint_request(self, coordinator, options.checkpoint_requests);
    if (!done) watch_run(self, coordinator, options, stall_timeout_s, clock);
  }
}

}  // namespace troupe::actors
