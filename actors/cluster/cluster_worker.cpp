// The worker half of the cluster host: joins a coordinator, builds and serves the stages it is
// assigned, and rebuilds them when the coordinator resets the pipeline after losing a peer.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "actors/cluster/cluster_control.h"
#include "actors/cluster/cluster_host.h"
#include "actors/config/job_file.h"
#include "actors/engine/partition.h"
#include "actors/engine/trace_recorder.h"
#include "actors/hosts/actor_hosting.h"
#include "actors/hosts/replica_groups.h"

namespace troupe::actors {
namespace {

using json = nlohmann::json;

/// Routes data messages to the local stage actors once they exist.
class stage_routes {
 public:
  void set(std::vector<std::pair<int, caf::actor>> routes, uint64_t job_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (job_id_ != 0) past_jobs_.push_back(job_id_);
    routes_ = std::move(routes);
    job_id_ = job_id;
  }
  /// Hands a data message to its stage; false (counted) when it belongs to another job or to a
  /// stage this worker does not host. Messages still in flight from an earlier generation of
  /// this job (before a reset) are dropped quietly.
  bool deliver(transport::message&& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (message.header.job_id != job_id_) {
      if (std::find(past_jobs_.begin(), past_jobs_.end(), message.header.job_id) !=
          past_jobs_.end()) {
        return true;
      }
      ++rejected_;
      return false;
    }
    for (auto& [stage, actor] : routes_) {
      if (stage == message.header.target_stage) {
        caf::anon_send(actor, std::move(message));
        return true;
      }
    }
    ++rejected_;
    return false;
  }
  uint64_t rejected() const { return rejected_.load(); }

 private:
  std::mutex mutex_;
  std::vector<std::pair<int, caf::actor>> routes_;
  uint64_t job_id_ = 0;
  std::vector<uint64_t> past_jobs_;
  std::atomic<uint64_t> rejected_{0};
};

/// The coordinator's clock minus this worker's, from NTP's four stamps of an exchange: a
/// message of this worker's sent (w0) and received (c1), the coordinator's answer sent (c2) and
/// received (w3). One exchange gives ((c1 - w0) + (c2 - w3)) / 2, off by at most half its round
/// trip (w3 - w0) - (c2 - c1); the exchange with the shortest round trip so far is kept (the
/// first, the hello, may have waited for the connection). On one host it comes out as about 0:
/// processes there share the monotonic clock.
class clock_estimate {
 public:
  /// Takes the stamps of an assignment or heartbeat of the coordinator's: its "echo" of this
  /// worker's last message, its "sent_s" and the "received_s" its arrival was stamped with.
  void add(const json& body) {
    const auto stamp = [](const json& from, const char* name) {
      return from.is_object() && from.contains(name) && from[name].is_number()
                 ? std::optional<double>(from[name].get<double>())
                 : std::nullopt;
    };
    const json echo = body.value("echo", json());
    const auto w0 = stamp(echo, "sent_s"), c1 = stamp(echo, "received_s");
    const auto c2 = stamp(body, "sent_s"), w3 = stamp(body, "received_s");
    if (!w0 || !c1 || !c2 || !w3) return;
    const double round_trip = (*w3 - *w0) - (*c2 - *c1);
    const double offset = ((*c1 - *w0) + (*c2 - *w3)) / 2;
    if (!std::isfinite(offset) || !(round_trip >= 0) || round_trip >= best_round_trip_s_) return;
    best_round_trip_s_ = round_trip;
    offset_s_ = offset;
  }
  double offset_s() const { return offset_s_; }

 private:
  double best_round_trip_s_ = std::numeric_limits<double>::infinity();
  double offset_s_ = 0;
};

/// This worker's end of its link to the coordinator: the socket, the address that names this
/// worker in the control messages it sends (pids repeat across hosts and containers), and its
/// estimate of the coordinator's clock.
struct coordinator_link {
  transport::outbox& outbox;
  std::string own_address;
  clock_source& own_clock;
  clock_estimate clock;
  uint64_t dropped_control = 0;  ///< malformed control messages, and finishes of other jobs

  /// Sends the control message `body` with this worker's address, pid and clock (for the
  /// coordinator's echo) added, and `payload`, when given, as a bytes frame.
  void send(json body, std::shared_ptr<const std::string> payload = nullptr) {
    body["address"] = own_address;
    body["pid"] = ::getpid();
    body["clock_s"] = own_clock.now_seconds();
    transport::message message = control_message(body);
    if (payload) transport::add_payload(message, std::move(payload));
    send_on(outbox, message);
  }
};

transport::message report_message(const stage_report& report, int stage,
                                  const std::string& own_address) {
  transport::message message =
      control_message({{"type", "report"},
                       {"address", own_address},
                       {"stage", stage},
                       {"version", report.version},
                       {"peak_contexts", report.peak_contexts},
                       {"peak_activation_bytes", report.peak_activation_bytes},
                       {"staleness", report.staleness_histogram},
                       {"weight_staleness", report.weight_staleness_histogram},
                       {"replica_staleness", report.replica_staleness_histogram}});
  for (const auto& weights : report.weights) {
    transport::add_payload(message, {static_cast<int64_t>(weights.size())},
                           std::make_shared<const std::vector<float>>(weights));
  }
  return message;
}

/// What a worker builds from its assignment.
struct worker_stages {
  job_config config;
  int stage_count = 0;  ///< stage actors of the whole job (every replica's)
  std::vector<int> indices;
  std::vector<std::shared_ptr<stage_parts>> parts;
};

std::optional<worker_stages> build_assigned_stages(const json& assignment,
                                                   const transport::security_settings& security,
                                                   transport::transport_context& context,
                                                   clock_source& clock, std::string* error) {
  job_error problem;
  auto config = parse_job(assignment.value("job_toml", ""), "the coordinator's job",
                          assignment.value("overrides", std::vector<std::string>{}), &problem);
  if (!config) {
    *error = problem.message;
    return std::nullopt;
  }
  auto ranges = partition_model(*config, error);
  if (!ranges) return std::nullopt;
  worker_stages result;
  result.config = *config;
  result.stage_count = stage_actor_count(result.config);
  address_book addresses;
  addresses.stages = assignment.value("addresses", std::vector<std::string>{});
  addresses.coordinator = assignment.value("coordinator", "");
  addresses.stage_keys = assignment.value("keys", std::vector<std::string>{});
  addresses.coordinator_key = assignment.value("coordinator_key", "");
  addresses.security = security;
  const std::vector<int> assigned = assignment.value("stages", std::vector<int>{});
  const int actors = stage_actor_count(result.config);
  // Each replica's workers keep their own order of passes.
  std::map<int, std::vector<std::shared_ptr<pass_turn>>> turns;
  for (int actor : assigned) {
    if (actor < 0 || actor >= actors || addresses.stages.size() != static_cast<size_t>(actors)) {
      *error = "the assignment names stage actor " + std::to_string(actor) + " of a job with " +
               std::to_string(actors) + " (" + std::to_string(result.config.parallelism.replicas) +
               " replica(s) of " + std::to_string(ranges->size()) + " stages)";
      return std::nullopt;
    }
    const int replica = replica_of_actor(result.config, actor);
    if (!turns.count(replica)) {
      turns[replica] = make_pass_turns(result.config);
      keep_local_turns(result.config, assigned, replica, &turns[replica]);
    }
  }
  for (int stage : assigned) {
    auto parts =
        make_stage_parts(result.config, (*ranges)[stage_of_actor(result.config, stage)], stage,
                         assignment.value("steps_per_epoch", int64_t{1}),
                         assignment.value("total_steps", int64_t{0}),
                         turns[replica_of_actor(result.config, stage)], context, addresses, error);
    if (!parts) return std::nullopt;
    parts->job_id = assignment.value("job_id", uint64_t{0});
    parts->clock = &clock;
    parts->collect_weights = true;
    result.indices.push_back(stage);
    result.parts.push_back(std::move(parts));
  }
  if (!join_replica_groups(result.config, result.parts,
                           assignment.value("group_ids", std::vector<std::string>{}),
                           replica_group_join_timeout_s, error)) {
    return std::nullopt;
  }
  return result;
}

/// Sends each local stage's final report to the coordinator.
void send_reports(caf::scoped_actor& self, const std::vector<std::pair<int, caf::actor>>& actors,
                  coordinator_link& coordinator, uint64_t dropped) {
  for (const auto& [stage, actor] : actors) {
    self->request(actor, caf::infinite, collect_atom::value)
        .receive(
            [&](const stage_report& report) {
              transport::message message = report_message(report, stage, coordinator.own_address);
              // The worker's dropped messages ride on its first report only.
              message.header.metrics["dropped"] = static_cast<double>(dropped);
              dropped = 0;
              send_on(coordinator.outbox, message);
            },
            [&](const caf::error&) {});
  }
}

/// Sends the spans and message arrows this worker's stages recorded (on its own clock, with its
/// estimate of the coordinator's clock offset) to the coordinator, which adds them to the run's
/// trace.
void send_trace(const trace_recorder& trace, const std::vector<int>& stages,
                coordinator_link& coordinator) {
  coordinator.send(
      {{"type", "trace"}, {"stages", stages}, {"clock_offset_s", coordinator.clock.offset_s()}},
      std::make_shared<const std::string>(trace.records().dump()));
}

/// Whether `body`, a finish or reset, ends the generation of `job_id` (0: whichever): the
/// coordinator's carry the job id of the assignment, which a stranger does not know.
bool for_this_job(const json& body, uint64_t job_id, uint64_t* dropped) {
  const std::string type = body["type"];
  if (job_id == 0 || (type != "finish" && type != "reset")) return true;
  if (body.value("job_id", uint64_t{0}) == job_id) return true;
  ++*dropped;
  std::fprintf(stderr, "troupe: worker %d ignored a %s from %s: not for its job\n", ::getpid(),
               type.c_str(),
               body.value("address", std::string("a peer without an address")).c_str());
  return false;
}

/// Waits for a control message of one of `types` from the coordinator (a finish or reset only
/// for `job_id`, unless it is 0), sending heartbeats the while; null, with `error` set, when
/// the coordinator stays silent for `silence_s`.
json await_coordinator(control_queue& control, coordinator_link& coordinator,
                       const std::set<std::string>& types, double silence_s,
                       const worker_options& options, clock_source& clock, std::string* error,
                       uint64_t job_id = 0,
                       const std::function<json(double now_s)>& heartbeat_body = {}) {
  const double heartbeat_s = options.liveness.heartbeat_s;
  double last_heard = clock.now_seconds(), last_sent = 0;
  for (;;) {
    auto message = control.pop(heartbeat_s);
    const double now = clock.now_seconds();
    if (message) {
      last_heard = now;
      json body = control_body(*message, &coordinator.dropped_control);
      if (!body.is_null()) coordinator.clock.add(body);
      if (!body.is_null() && types.count(body["type"].get<std::string>()) &&
          for_this_job(body, job_id, &coordinator.dropped_control))
        return body;
    }
    if (options.stop_requests != nullptr && options.stop_requests->exchange(false)) {
      coordinator.send({{"type", "stop"}, {"reason", "the worker was asked to stop (SIGTERM)"}});
    }
    if (now - last_sent >= heartbeat_s) {
      json heartbeat = heartbeat_body ? heartbeat_body(now) : json::object();
      heartbeat["type"] = "heartbeat";
      coordinator.send(std::move(heartbeat));
      last_sent = now;
    }
    if (now - last_heard > silence_s) {
      *error = "the coordinator at " + options.coordinator_address + " has been silent for " +
               std::to_string(static_cast<int>(now - last_heard)) + " s";
      return json();
    }
  }
}

/// Builds the assigned stages, serves them until the coordinator says finish or reset, then
/// stops them. Returns the next control body (finish or reset), or null with `error` set.
json serve_generation(const json& assignment, control_queue& control, coordinator_link& coordinator,
                      transport::transport_context& context, stage_routes& routes,
                      const worker_options& options, clock_source& clock,
                      const std::function<uint64_t()>& dropped,
                      std::vector<std::shared_ptr<stage_parts>>* retired, bool* bad_assignment,
                      std::string* error) {
  auto stages = build_assigned_stages(assignment, options.security, context, clock, error);
  if (!stages) {
    *bad_assignment = true;
    return json();
  }
  std::unique_ptr<trace_recorder> trace;
  if (stages->config.metrics.trace) {
    trace = std::make_unique<trace_recorder>(stages->stage_count);
    for (auto& parts : stages->parts) parts->trace = trace.get();
  }
  // What the stages do, shipped with each heartbeat for the coordinator's monitor.
  run_monitor activity(json::object(), stages->stage_count, clock.now_seconds(), 4096);
  for (auto& parts : stages->parts) parts->monitor = &activity;
  double spans_sent_s = clock.now_seconds();
  const auto heartbeat_body = [&](double now) {
    json body = activity.heartbeat_json(stages->indices, spans_sent_s, now);
    spans_sent_s = now;
    // A heartbeat must always get through: past half a control message's room, it goes bare.
    if (body.dump().size() > transport::decode_limits{}.max_text_bytes / 2) body = json::object();
    return body;
  };
  json next;
  {
    caf::actor_system_config settings;
    // Stages on threads of their own leave the scheduler nothing but the actor system's own.
    const bool own_threads =
        stages_get_own_threads(stages->parts.size()) || uses_replica_groups(stages->config);
    configure_scheduler(settings, own_threads
                                      ? 1
                                      : std::min<int>(static_cast<int>(stages->parts.size()),
                                                      std::thread::hardware_concurrency()));
    caf::actor_system system{settings};
    caf::scoped_actor self{system};
    std::vector<std::pair<int, caf::actor>> actors;
    std::vector<caf::actor> handles;
    for (size_t i = 0; i < stages->parts.size(); ++i) {
      handles.push_back(spawn_stage_actor(system, stages->parts[i], own_threads));
      actors.push_back({stages->indices[i], handles.back()});
    }
    connect_worker_siblings(stages->config, stages->parts, handles);
    const uint64_t job_id = assignment.value("job_id", uint64_t{0});
    routes.set(actors, job_id);
    coordinator.send({{"type", "ready"}, {"stages", stages->indices}, {"job_id", job_id}});
    next = await_coordinator(control, coordinator, {"finish", "reset"}, options.liveness.timeout_s,
                             options, clock, error, job_id, heartbeat_body);
    if (!next.is_null() && next["type"] == "finish") {
      if (trace) send_trace(*trace, stages->indices, coordinator);
      json usage = to_json(this_process_usage("worker", stages->indices));
      usage["type"] = "usage";
      coordinator.send(std::move(usage));
      send_reports(self, actors, coordinator, dropped());
    }
    routes.set({}, 0);
    for (auto& [stage, actor] : actors) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    actors.clear();
    handles.clear();
    release_actor_handles(stages->parts);
  }  // the actor system waits for the stage actors here
  // Messages still queued for a lost peer hold tensors of these stages' backends until ZeroMQ
  // drops them: close the sockets now, free the backends only after the context has ended.
  for (auto& parts : stages->parts) {
    close_outboxes(*parts);
    parts->trace = nullptr;
    parts->monitor = nullptr;
    retired->push_back(parts);
  }
  return next;
}

}  // namespace

int run_worker(const worker_options& options, clock_source& clock, std::string* error) {
  // Outlives the transport context (destroyed after it): see serve_generation.
  std::vector<std::shared_ptr<stage_parts>> retired;
  transport::transport_context context;
  auto authenticator = start_authenticator(context, options.security, error);
  if (options.security.curve && !authenticator) return 2;
  transport::endpoint_error problem;
  auto in = transport::inbox::bind(context, options.listen_address,
                                   endpoint_settings(options.security), &problem);
  if (!in) {
    *error = problem.text;
    return 2;
  }
  const std::string own_address = in->address();
  // The final reports (weights included) are the last thing a worker sends: closing waits up
  // to the heartbeat timeout for them to leave instead of dropping them.
  transport::security_settings to_coordinator = options.security;
  to_coordinator.server_public_key = options.coordinator_key;
  transport::endpoint_options lingering = endpoint_settings(to_coordinator);
  lingering.linger_ms = static_cast<int>(options.liveness.timeout_s * 1000);
  auto coordinator =
      transport::outbox::connect(context, options.coordinator_address, lingering, &problem);
  if (!coordinator) {
    *error = problem.text;
    return 2;
  }
  control_queue control;
  stage_routes routes;
  coordinator_link link{*coordinator, own_address, clock, {}, 0};
  std::vector<transport::inbox> inboxes;
  inboxes.push_back(std::move(*in));
  transport::receiver_thread receiver(
      context, std::move(inboxes),
      [&](transport::message&& message) {
        if (is_control(message)) {
          control.push(std::move(message), clock.now_seconds());
          return;
        }
        const int target = message.header.target_stage;
        const uint64_t job = message.header.job_id;
        if (!routes.deliver(std::move(message))) {
          std::fprintf(stderr,
                       "troupe: worker %d dropped a message for stage %d of job %llu: not a "
                       "stage it hosts for this job\n",
                       ::getpid(), target, static_cast<unsigned long long>(job));
        }
      },
      log_dropped_frame);
  json hello = {{"type", "hello"},
                {"protocol", transport::current_protocol_version},
                {"job_hash", options.job_hash},
                {"host", host_name()},
                {"public_key", options.security.own.public_key}};
  if (!options.run_secret.empty()) hello["secret"] = options.run_secret;
  // A refusal with retry_s (the job has all its workers, one of which may be gone unnoticed)
  // is followed by another hello, until the startup time is up.
  const double give_up_s = clock.now_seconds() + options.liveness.startup_s;
  json next;
  std::string last_refusal;
  for (double left = options.liveness.startup_s; left > 0; left = give_up_s - clock.now_seconds()) {
    link.send(hello);
    next = wait_for(control, {"assign", "refuse"}, left, clock);
    const double retry_s = next.is_null() ? 0.0 : next.value("retry_s", 0.0);
    if (next.is_null() || next["type"] != "refuse" || !(retry_s > 0)) break;
    last_refusal = next.value("reason", std::string("refused"));
    std::fprintf(stderr, "troupe: worker %d: %s; saying hello again in %.1f s\n", ::getpid(),
                 last_refusal.c_str(), retry_s);
    wait_for(control, {}, std::min(retry_s, std::max(0.0, give_up_s - clock.now_seconds())), clock);
    next = json();
  }
  if (next.is_null()) {
    *error = "no assignment from the coordinator at " + options.coordinator_address + " within " +
             std::to_string(static_cast<int>(options.liveness.startup_s)) + " s" +
             (last_refusal.empty() ? "" : " (it last said: " + last_refusal + ")");
    return 1;
  }
  int status = 0;
  bool bad_assignment = false;
  const auto dropped = [&] {
    return receiver.dropped() + routes.rejected() + std::exchange(link.dropped_control, 0);
  };
  // One generation per assignment; a reset (a peer was lost) leads to a new assignment.
  while (status == 0 && next["type"] != "finish") {
    if (next["type"] == "refuse") {
      *error = "the coordinator at " + options.coordinator_address +
               " refused this worker: " + next.value("reason", std::string("no reason given"));
      status = 2;
      break;
    }
    if (next["type"] == "reset") {
      next = await_coordinator(control, link, {"assign", "finish"}, options.liveness.timeout_s,
                               options, clock, error);
    } else {
      link.clock.add(next);
      next = serve_generation(next, control, link, context, routes, options, clock, dropped,
                              &retired, &bad_assignment, error);
    }
    if (next.is_null()) status = bad_assignment ? 2 : 1;
  }
  receiver.stop();
  return status;
}

}  // namespace troupe::actors
