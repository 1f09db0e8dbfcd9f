#include "actors/hosts/actor_hosting.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <new>
#include <thread>

#include "actors/config/job_file.h"
#include "actors/engine/stage_state.h"
#include "actors/hosts/mail_polling.h"
#include "actors/hosts/wire_format.h"
#include "layers/backend_registry.h"
#include "layers/out_of_memory.h"

namespace troupe::actors {
namespace {

/// Far more than max_active_keys messages ever wait on one socket, so a send never finds a
/// full queue; admission, not the socket, bounds memory.
constexpr int high_water_mark = 1 << 14;

}  // namespace

transport::endpoint_options endpoint_settings(const transport::security_settings& security) {
  transport::endpoint_options options;
  options.security = security;
  options.send_high_water_mark = high_water_mark;
  options.receive_high_water_mark = high_water_mark;
  return options;
}

bool send_on(transport::outbox& out, const transport::message& message, const caf::actor& reader) {
  const transport::send_result result = out.send_waiting(message, std::chrono::milliseconds(-1));
  if (!result.ok()) {
    std::fprintf(stderr, "troupe: send to %s failed: %s\n", out.address().c_str(),
                 result.detail.c_str());
  } else if (reader) {
    caf::anon_send(reader, take_atom::value);
  }
  return result.ok();
}

static const char* span_name(key_kind kind, bool last, bool stepped) {
  if (kind == key_kind::evaluate) return "evaluate";
  if (kind == key_kind::step) return "step";
  if (kind == key_kind::reduce) return stepped ? "reduce+step" : "reduce";
  if (kind == key_kind::forward)
    return last ? (stepped ? "forward+backward+step" : "forward+backward") : "forward";
  return stepped ? "backward+step" : "backward";
}

/// Remembers the last message the stage sent, for its monitor.
static void note_sent(stage_parts& parts, const transport::message& message, double at_s) {
  if (!parts.monitor) return;
  parts.published.last_sent = {transport::to_string(message.header.kind),
                               static_cast<int64_t>(message.header.key),
                               message.header.target_stage, at_s};
}

/// Sends `output` to `target` (destination_of()).
static void send_output(stage_parts& parts, stage_output& output, int target) {
  const double now = parts.clock->now_seconds();
  wire_route route{parts.job_id, parts.index, transport::coordinator_stage, parts.logic->version(),
                   now};
  transport::message message;
  if (target == output_for_coordinator) {
    message = report_to_wire(output, route);
    send_on(*parts.coordinator, message, parts.coordinator_reader);
  } else if (target == output_for_replica_peer) {
    route.target_stage = parts.replica_next_index;
    message = to_wire(output.message, route);
    send_on(*parts.replica_next, message, parts.replica_next_reader);
  } else {
    route.target_stage = target;
    const bool forward = target > parts.index;
    message = to_wire(output.message, route);
    send_on(forward ? *parts.next : *parts.previous, message,
            forward ? parts.next_reader : parts.previous_reader);
  }
  note_sent(parts, message, now);
}

/// Sends what a pass produced: first what other stages wait for, then the reports. Waking the
/// coordinator lets it take the sender's core at once, so a report sent first would delay the
/// next stage's input by the coordinator's whole turn.
static void send_outputs(stage_parts& parts, std::vector<stage_output>& outputs) {
  for (const bool reports : {false, true}) {
    for (stage_output& output : outputs) {
      const int target = destination_of(parts.index, output);
      if ((target == output_for_coordinator) == reports) send_output(parts, output, target);
    }
  }
}

/// A span of the stage's work, for its trace and its monitor.
static void record_span(stage_parts& parts, const char* name, int64_t key, double start_s) {
  if (!parts.trace && !parts.monitor) return;
  const double duration = parts.clock->now_seconds() - start_s;
  if (parts.trace) parts.trace->span(parts.index, name, key, start_s, duration);
  if (parts.monitor) parts.monitor->add_span(parts.index, name, key, start_s, duration);
}

/// Runs on whichever CAF scheduler thread picked the stage's actor; the backend makes its
/// device current in every call, and key_from_wire() and the stage device hand over finished
/// tensors only, so nothing here depends on the thread or on stream order.
static void handle_at_stage(stage_parts& parts, const transport::message& incoming) {
  const double start = parts.clock->now_seconds();
  std::string error;
  auto message = key_from_wire(incoming, *parts.backend, &error);
  if (!message) {
    std::fprintf(stderr, "troupe: stage %d dropped a message from stage %d: %s\n", parts.index,
                 incoming.header.source_stage, error.c_str());
    return;
  }
  const int64_t version = parts.logic->version();
  std::string refusal;
  std::vector<stage_output> outputs = parts.logic->handle(*message, &refusal);
  if (!refusal.empty()) {
    std::fprintf(stderr, "troupe: stage %d refused a %s message from stage %d: %s\n", parts.index,
                 transport::to_string(incoming.header.kind), incoming.header.source_stage,
                 refusal.c_str());
    return;
  }
  if (parts.trace) {
    parts.trace->flow(incoming.header.source_stage, parts.index, message->key, sent_time(incoming),
                      start);
  }
  record_span(parts,
              span_name(message->kind, parts.logic->is_last(), parts.logic->version() != version),
              static_cast<int64_t>(message->key), start);
  send_outputs(parts, outputs);
}

/// Answers the coordinator's save_state with the stage's shard (stage_state), and its
/// load_state or load_weights with state_loaded, or state_refused saying why the shard did not
/// fit.
static void handle_state_request(stage_parts& parts, const transport::message& incoming) {
  using transport::message_kind;
  wire_route route{parts.job_id, parts.index, transport::coordinator_stage, parts.logic->version(),
                   parts.clock->now_seconds()};
  if (incoming.header.kind == message_kind::save_state) {
    auto shard =
        std::make_shared<const std::string>(serialize_stage_state(parts.logic->save_state()));
    send_on(*parts.coordinator,
            state_to_wire(message_kind::stage_state, incoming.header.step, std::move(shard), route),
            parts.coordinator_reader);
    return;
  }
  std::string error;
  auto bytes = state_from_wire(incoming, &error);
  std::optional<stage_state> state;
  if (bytes) state = parse_stage_state(bytes->data(), bytes->size(), &error);
  const bool weights_only = incoming.header.kind == message_kind::load_weights;
  if (state) parts.logic->load_state(*state, weights_only, &error);
  transport::message reply =
      state_to_wire(error.empty() ? message_kind::state_loaded : message_kind::state_refused,
                    incoming.header.step, nullptr, route);
  if (!error.empty()) reply.header.text = "stage " + std::to_string(parts.index) + ": " + error;
  send_on(*parts.coordinator, reply, parts.coordinator_reader);
}

static stage_report snapshot(stage_parts& parts) {
  parts.logic->finish_deferred_step();
  stage_report report;
  report.staleness_histogram = parts.logic->staleness_histogram();
  report.weight_staleness_histogram = parts.logic->weight_staleness_histogram();
  report.replica_staleness_histogram = parts.logic->replica_staleness_histogram();
  report.peak_contexts = parts.logic->peak_contexts();
  report.peak_activation_bytes = parts.device->peak_activation_bytes();
  report.version = parts.logic->version();
  if (parts.collect_weights) {
    // The weights are finished (stage_device's contract), so any stream may read them.
    for (layers::parameter* p : parts.device->parameters()) {
      report.weights.push_back(p->value.to_host(parts.backend->default_stream()));
    }
  }
  return report;
}

/// The next pass of a zero-bubble order runs when the stage reaches the reminder it sends
/// itself, once what came before it has been sent on (a B's input gradient before its W).
static void remind_of_ready_work(caf::stateful_actor<stage_actor_state>* self) {
  if (self->state.ready_work_requested || !self->state.parts->logic->has_ready_work()) return;
  self->state.ready_work_requested = true;
  self->send(self, ready_work_atom::value);
}

static void run_ready_work(stage_parts& parts) {
  const double start = parts.clock->now_seconds();
  const int64_t version = parts.logic->version();
  std::vector<stage_output> outputs = parts.logic->run_ready_work();
  record_span(parts, parts.logic->version() != version ? "scheduled+step" : "scheduled", -1, start);
  send_outputs(parts, outputs);
}

/// After this stage moved its worker's turn on, the sibling whose pass is next may hold the
/// message for it already: it is told to look.
static void wake_turn_holder(caf::event_based_actor* self, stage_parts& parts, int before) {
  const int holder = parts.logic->stage_with_next_pass();
  if (holder == before || holder == parts.logic->stage_index()) return;
  auto sibling = parts.worker_siblings.find(holder);
  if (sibling != parts.worker_siblings.end()) self->send(sibling->second, ready_work_atom::value);
}

/// Whether `incoming` must wait: a forward the stage may not take yet (1F1B's bound on keys
/// between forward and backward), and while the step's gradients are summed with the
/// replicas, anything but a backward pass or a ring chunk.
static bool must_wait(const stage_parts& parts, const transport::message& incoming) {
  using transport::message_kind;
  const message_kind kind = incoming.header.kind;
  if (kind == message_kind::forward) return !parts.logic->ready_for_forward();
  if (kind == message_kind::save_state || kind == message_kind::load_state ||
      kind == message_kind::load_weights) {
    return parts.logic->settling();  // the state is final once the replicas' all-reduce ends
  }
  return parts.logic->reducing() && kind != message_kind::backward &&
         kind != message_kind::gradient_chunk && kind != message_kind::optimizer_step;
}

static void handle_now(stage_parts& parts, const transport::message& incoming) {
  const auto kind = incoming.header.kind;
  if (kind == transport::message_kind::save_state || kind == transport::message_kind::load_state ||
      kind == transport::message_kind::load_weights) {
    handle_state_request(parts, incoming);
  } else {
    handle_at_stage(parts, incoming);
  }
}

/// Tells the monitor what the stage now holds, after a message (its own thread: the mailbox
/// is read from here).
static void publish_activity(caf::stateful_actor<stage_actor_state>* self) {
  stage_parts& parts = *self->state.parts;
  if (!parts.monitor) return;
  // Filled in place: after the first messages, publishing allocates nothing.
  stage_activity& activity = parts.published;
  activity.version = parts.logic->version();
  parts.logic->keys_held(&activity.keys_held);
  activity.keys_waiting.clear();
  for (const auto* held : {&self->state.waiting, &self->state.taken}) {
    for (const transport::message& message : *held)
      activity.keys_waiting.push_back(static_cast<int64_t>(message.header.key));
  }
  activity.mailbox = static_cast<int64_t>(self->mailbox().size());
  activity.staleness_histogram = parts.logic->staleness_histogram();
  parts.monitor->set_activity(parts.index, activity);
}

/// What the monitor and the fault hook learn of a message as the stage takes it.
static void note_arrival(stage_parts& parts, const transport::message& incoming) {
  if (!parts.monitor && !parts.fault_hook) return;
  const message_note note{transport::to_string(incoming.header.kind),
                          static_cast<int64_t>(incoming.header.key), incoming.header.source_stage,
                          parts.clock->now_seconds()};
  if (parts.monitor) parts.monitor->note_received(parts.index, note);
  if (parts.fault_hook) parts.fault_hook(parts.index, note);
}

/// Messages that must wait keep their order in the actor's state until the stage can take
/// them.
static void take_stage_message(caf::stateful_actor<stage_actor_state>* self,
                               const transport::message& incoming) {
  stage_parts& parts = *self->state.parts;
  std::deque<transport::message>& waiting = self->state.waiting;
  note_arrival(parts, incoming);
  if (must_wait(parts, incoming)) {
    waiting.push_back(incoming);
    return;
  }
  const int before = parts.logic->stage_with_next_pass();
  handle_now(parts, incoming);
  while (!waiting.empty() && !must_wait(parts, waiting.front())) {
    const transport::message next = std::move(waiting.front());
    waiting.pop_front();
    handle_now(parts, next);
  }
  if (!parts.logic->settling()) {
    for (caf::response_promise& promise : self->state.waiting_reports) {
      promise.deliver(snapshot(parts));
    }
    self->state.waiting_reports.clear();
  }
  remind_of_ready_work(self);
  wake_turn_holder(self, parts, before);
}

static void on_stage_message(caf::stateful_actor<stage_actor_state>* self,
                             const transport::message& incoming) {
  take_stage_message(self, incoming);
  publish_activity(self);
}

/// In one process, one take_atom announces each message to the stage's inbox, and the inbox
/// takes turns among its senders: read one per take, a message from one sender went before one
/// that had waited longer in another's pipe, and a replica's ring chunks, taken in turns with
/// the coordinator's keys, moved an average of the weights by one chunk per key, so that the
/// averages fell further behind the steps with every step. So each take reads everything the
/// inbox holds, in the order it came, and handles one message: the first ring chunk if there
/// is one, else the first read.
static void take_for_stage(caf::stateful_actor<stage_actor_state>* self) {
  stage_parts& parts = *self->state.parts;
  if (!parts.inbox) return;
  std::deque<transport::message>& taken = self->state.taken;
  while (std::optional<transport::decode_result> received = parts.inbox->try_receive()) {
    if (received->ok()) {
      taken.push_back(std::move(*received->value));
      continue;
    }
    report_dropped_frame(*parts.inbox, *received, parts.dropped_frames);
    ++self->state.dropped_unclaimed;
  }
  if (taken.empty()) {
    // A dropped frame may have been the one announced (a sender that bypassed send_on);
    // otherwise the message was announced before it could be read.
    if (self->state.dropped_unclaimed > 0) {
      --self->state.dropped_unclaimed;
    } else {
      self->send(self, take_atom::value);
    }
    return;
  }
  auto next = std::find_if(taken.begin(), taken.end(), [](const transport::message& message) {
    return message.header.kind == transport::message_kind::gradient_chunk;
  });
  if (next == taken.end()) next = taken.begin();
  const transport::message incoming = std::move(*next);
  taken.erase(next);
  on_stage_message(self, incoming);
}

/// After each piece of work a stage on a thread of its own polls a while for the next before
/// the thread sleeps; a stage on the scheduler's threads shares its core, which is not the
/// poller's to take.
static void await_next(caf::stateful_actor<stage_actor_state>* self) {
  if (!self->getf(caf::abstract_actor::is_detached_flag)) return;
  stage_parts& parts = *self->state.parts;
  poll_for_mail(self, parts.spin_wait_s, *parts.clock);
}

void exit_when_out_of_memory(caf::scheduled_actor* self, std::string who) {
  self->set_exception_handler(
      [who = std::move(who)](caf::scheduled_actor* actor, std::exception_ptr& failure) {
        try {
          std::rethrow_exception(failure);
        } catch (const std::bad_alloc& problem) {
          std::fprintf(stderr, "troupe: %s: %s\n", who.c_str(),
                       layers::out_of_memory_message(problem).c_str());
          std::_Exit(2);  // other threads still run: no static destructors, no flush of their work
        } catch (...) {
        }
        return caf::scheduled_actor::default_exception_handler(actor, failure);
      });
}

caf::behavior stage_actor(caf::stateful_actor<stage_actor_state>* self,
                          std::shared_ptr<stage_parts> parts) {
  exit_when_out_of_memory(self, "stage " + std::to_string(parts->index));
  self->state.parts = std::move(parts);
  return {
      [self](const transport::message& incoming) {
        on_stage_message(self, incoming);
        await_next(self);
      },
      [self](take_atom) {
        take_for_stage(self);
        await_next(self);
      },
      [self](ready_work_atom) {
        self->state.ready_work_requested = false;
        const int before = self->state.parts->logic->stage_with_next_pass();
        run_ready_work(*self->state.parts);
        remind_of_ready_work(self);
        wake_turn_holder(self, *self->state.parts, before);
        publish_activity(self);
        await_next(self);
      },
      [self](collect_atom) -> caf::result<stage_report> {
        if (!self->state.parts->logic->settling()) return snapshot(*self->state.parts);
        // An all-reduce with the replicas is under way: the report follows once it ends.
        self->state.waiting_reports.push_back(self->make_response_promise());
        return caf::delegated<stage_report>();
      },
  };
}

void close_outboxes(stage_parts& parts) {
  parts.next.reset();
  parts.previous.reset();
  parts.coordinator.reset();
  parts.replica_next.reset();
  parts.inbox.reset();
  parts.next_reader = parts.previous_reader = parts.coordinator_reader = caf::actor{};
  parts.replica_next_reader = caf::actor{};
}

void configure_scheduler(caf::actor_system_config& settings, int threads) {
  settings.set("scheduler.max-threads", std::max(1, threads));
  settings.set("scheduler.policy", caf::atom("sharing"));
}

std::optional<transport::outbox> connect_outbox(transport::transport_context& context,
                                                const std::string& address, std::string* error,
                                                const transport::security_settings& security,
                                                const std::string& server_key) {
  transport::security_settings settings = security;
  settings.server_public_key = server_key;
  transport::endpoint_error problem;
  auto out = transport::outbox::connect(context, address, endpoint_settings(settings), &problem);
  if (!out) *error = problem.text;
  return out;
}

static std::string key_of(const address_book& addresses, int stage) {
  return stage < static_cast<int>(addresses.stage_keys.size()) ? addresses.stage_keys[stage] : "";
}

std::shared_ptr<stage_parts> make_stage_parts(const job_config& config, const stage_range& range,
                                              int index, int64_t steps_per_epoch,
                                              int64_t total_steps,
                                              const std::vector<std::shared_ptr<pass_turn>>& turns,
                                              transport::transport_context& context,
                                              const address_book& addresses, std::string* error) {
  auto parts = std::make_shared<stage_parts>();
  parts->index = index;
  parts->spin_wait_s = spin_wait_seconds(config.parallelism);
  const int stage = stage_of_actor(config, index);
  const int replica = replica_of_actor(config, index);
  parts->backend =
      layers::create_backend(device_of_actor(config, index), threads_per_stage(config), error);
  if (!parts->backend) return nullptr;
  parts->device = make_layers_stage_device(config, range, *parts->backend);
  parts->logic = std::make_unique<stage_logic>(
      stage_settings_of(config, stage, steps_per_epoch, total_steps, turns, replica),
      *parts->device);
  const int stages = config.parallelism.stages;
  const auto connect = [&](int actor) {
    return connect_outbox(context, addresses.stages[actor], error, addresses.security,
                          key_of(addresses, actor));
  };
  if (stage + 1 < stages) {
    parts->next = connect(index + 1);
    if (!parts->next) return nullptr;
  }
  if (stage > 0) {
    parts->previous = connect(index - 1);
    if (!parts->previous) return nullptr;
  }
  const int replicas = config.parallelism.replicas;
  if (replicas > 1) {
    parts->replica_next_index = replica_peer_of_actor(config, index);
    parts->replica_next = connect(parts->replica_next_index);
    if (!parts->replica_next) return nullptr;
  }
  parts->coordinator = connect_outbox(context, addresses.coordinator, error, addresses.security,
                                      addresses.coordinator_key);
  if (!parts->coordinator) return nullptr;
  return parts;
}

double spin_wait_seconds(const parallelism_config& parallelism) {
  if (parallelism.spin_wait_ms >= 0) return parallelism.spin_wait_ms / 1000;
  // A sync pipeline's coordinator works during the flush, when no stage computes; an async
  // one's works beside the stages, and a polling stage would hide from the kernel the idle core
  // that the coordinator should take (measured on the MLP 784-512x3-10 in 2 stages, 3 ABBA
  // rounds: sync 1.12x as fast with polling, async 0.97x).
  return parallelism.mode == pipeline_mode::sync ? 0.010 : 0.0;
}

bool stages_get_own_threads(size_t stage_actors) {
  return stage_actors <= std::max(1u, std::thread::hardware_concurrency());
}

caf::actor spawn_stage_actor(caf::actor_system& system, std::shared_ptr<stage_parts> parts,
                             bool own_thread) {
  if (own_thread) return system.spawn<caf::detached>(stage_actor, std::move(parts));
  return system.spawn(stage_actor, std::move(parts));
}

void release_actor_handles(const std::vector<std::shared_ptr<stage_parts>>& parts) {
  for (const auto& stage : parts) {
    stage->next_reader = stage->previous_reader = nullptr;
    stage->coordinator_reader = stage->replica_next_reader = nullptr;
    stage->worker_siblings.clear();
  }
}

void connect_worker_siblings(const job_config& config,
                             const std::vector<std::shared_ptr<stage_parts>>& parts,
                             const std::vector<caf::actor>& actors) {
  for (size_t i = 0; i < parts.size(); ++i) {
    for (size_t j = 0; j < parts.size(); ++j) {
      const int a = parts[i]->index, b = parts[j]->index;
      if (i != j && replica_of_actor(config, a) == replica_of_actor(config, b) &&
          pipeline_worker_of(config, stage_of_actor(config, a)) ==
              pipeline_worker_of(config, stage_of_actor(config, b))) {
        parts[i]->worker_siblings[stage_of_actor(config, b)] = actors[j];
      }
    }
  }
}

}  // namespace troupe::actors
