#include "actors/cluster_host.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "actors/actor_hosting.h"
#include "actors/job_file.h"
#include "actors/partition.h"
#include "layers/backend_registry.h"

namespace troupe::actors {
namespace {

using json = nlohmann::json;

/// Control messages (JSON text) handed from a receiver thread to the main thread.
class control_queue {
 public:
  void push(transport::message message) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      messages_.push_back(std::move(message));
    }
    ready_.notify_one();
  }

  /// The oldest message, waiting up to `seconds`; nothing on timeout.
  std::optional<transport::message> pop(double seconds) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ready_.wait_for(lock, std::chrono::duration<double>(seconds),
                         [&] { return !messages_.empty(); })) {
      return std::nullopt;
    }
    transport::message message = std::move(messages_.front());
    messages_.pop_front();
    return message;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<transport::message> messages_;
};

bool is_control(const transport::message& message) {
  return message.header.kind == transport::message_kind::control && !message.header.text.empty();
}

transport::message control_message(const json& body) {
  transport::message message;
  message.header.kind = transport::message_kind::control;
  message.header.text = body.dump();
  return message;
}

/// The JSON body of a control message, or null when it is not an object with a "type".
json control_body(const transport::message& message) {
  json body = json::parse(message.header.text, nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("type")) return json();
  return body;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

/// Waits for a control message of `type` on `queue` (others are dropped) until `seconds` pass.
json wait_for(control_queue& queue, const std::string& type, double seconds, clock_source& clock) {
  const double deadline = clock.now_seconds() + seconds;
  for (double left = seconds; left > 0; left = deadline - clock.now_seconds()) {
    auto message = queue.pop(left);
    if (!message) break;
    json body = control_body(*message);
    if (!body.is_null() && body["type"] == type) return body;
  }
  return json();
}

/// With CURVE, the ZAP handler that admits only the cluster's keys; null without CURVE (or
/// with `error` set when it cannot start).
std::unique_ptr<transport::zap_authenticator> start_authenticator(
    transport::transport_context& context, const transport::security_settings& security,
    std::string* error) {
  if (!security.curve) return nullptr;
  return transport::zap_authenticator::start(context, error);
}

/// Routes data messages to the local stage actors once they exist.
class stage_routes {
 public:
  void set(std::vector<std::pair<int, caf::actor>> routes, uint64_t job_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    routes_ = std::move(routes);
    job_id_ = job_id;
  }
  /// Hands a data message to its stage; false (counted) when it belongs to another job or to a
  /// stage this worker does not host.
  bool deliver(transport::message&& message) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (message.header.job_id != job_id_) {
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
  std::atomic<uint64_t> rejected_{0};
};

transport::message report_message(const stage_report& report, int stage) {
  transport::message message =
      control_message({{"type", "report"},
                       {"stage", stage},
                       {"version", report.version},
                       {"peak_contexts", report.peak_contexts},
                       {"staleness", report.staleness_histogram},
                       {"weight_staleness", report.weight_staleness_histogram}});
  for (const auto& weights : report.weights) {
    transport::add_payload(message, {static_cast<int64_t>(weights.size())},
                           std::make_shared<const std::vector<float>>(weights));
  }
  return message;
}

stage_report report_from(const json& body, const transport::message& message) {
  stage_report report;
  report.version = body.value("version", int64_t{0});
  report.peak_contexts = body.value("peak_contexts", size_t{0});
  report.staleness_histogram = body.value("staleness", std::vector<int64_t>{});
  report.weight_staleness_histogram = body.value("weight_staleness", std::vector<int64_t>{});
  for (const transport::frame& frame : message.payloads) {
    const auto* begin = static_cast<const float*>(frame.data);
    report.weights.emplace_back(begin, begin + frame.bytes / sizeof(float));
  }
  return report;
}

/// What a worker builds from its assignment.
struct worker_stages {
  job_config config;
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
  address_book addresses;
  addresses.stages = assignment.value("addresses", std::vector<std::string>{});
  addresses.coordinator = assignment.value("coordinator", "");
  addresses.stage_keys = assignment.value("keys", std::vector<std::string>{});
  addresses.coordinator_key = assignment.value("coordinator_key", "");
  addresses.security = security;
  for (int stage : assignment.value("stages", std::vector<int>{})) {
    if (stage < 0 || stage >= static_cast<int>(ranges->size()) ||
        addresses.stages.size() != ranges->size()) {
      *error = "the assignment names stage " + std::to_string(stage) + " of a " +
               std::to_string(ranges->size()) + "-stage job";
      return std::nullopt;
    }
    auto parts = make_stage_parts(
        result.config, (*ranges)[stage], stage, assignment.value("steps_per_epoch", int64_t{1}),
        assignment.value("total_steps", int64_t{0}), context, addresses, error);
    if (!parts) return std::nullopt;
    parts->job_id = assignment.value("job_id", uint64_t{0});
    parts->clock = &clock;
    parts->collect_weights = true;
    result.indices.push_back(stage);
    result.parts.push_back(std::move(parts));
  }
  return result;
}

/// Sends each local stage's final report to the coordinator.
void send_reports(caf::scoped_actor& self, const std::vector<std::pair<int, caf::actor>>& actors,
                  transport::outbox& coordinator, uint64_t dropped) {
  for (const auto& [stage, actor] : actors) {
    self->request(actor, caf::infinite, collect_atom::value)
        .receive(
            [&](const stage_report& report) {
              transport::message message = report_message(report, stage);
              // The worker's dropped messages ride on its first report only.
              message.header.metrics["dropped"] = static_cast<double>(dropped);
              dropped = 0;
              send_on(coordinator, message);
            },
            [&](const caf::error&) {});
  }
}

/// Serves until the coordinator says finish (0) or goes silent (1).
int serve(control_queue& control, transport::outbox& coordinator, const worker_options& options,
          caf::scoped_actor& self, const std::vector<std::pair<int, caf::actor>>& actors,
          const std::function<uint64_t()>& dropped, clock_source& clock, std::string* error) {
  const liveness_settings& live = options.liveness;
  double last_heard = clock.now_seconds(), last_sent = 0;
  for (;;) {
    auto message = control.pop(live.heartbeat_s);
    const double now = clock.now_seconds();
    if (message) {
      last_heard = now;
      json body = control_body(*message);
      if (!body.is_null() && body["type"] == "finish") {
        send_reports(self, actors, coordinator, dropped());
        return 0;
      }
    }
    if (now - last_sent >= live.heartbeat_s) {
      send_on(coordinator, control_message({{"type", "heartbeat"}, {"pid", ::getpid()}}));
      last_sent = now;
    }
    if (now - last_heard > live.timeout_s) {
      *error = "the coordinator at " + options.coordinator_address + " has been silent for " +
               std::to_string(static_cast<int>(now - last_heard)) + " s";
      return 1;
    }
  }
}

}  // namespace

int run_worker(const worker_options& options, clock_source& clock, std::string* error) {
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
  std::vector<transport::inbox> inboxes;
  inboxes.push_back(std::move(*in));
  transport::receiver_thread receiver(
      context, std::move(inboxes),
      [&](transport::message&& message) {
        if (is_control(message)) {
          control.push(std::move(message));
        } else {
          const int target = message.header.target_stage;
          const uint64_t job = message.header.job_id;
          if (!routes.deliver(std::move(message))) {
            std::fprintf(stderr,
                         "troupe: worker %d dropped a message for stage %d of job %llu: not a "
                         "stage it hosts for this job\n",
                         ::getpid(), target, static_cast<unsigned long long>(job));
          }
        }
      },
      [](const std::string& address, const transport::decode_error& failure) {
        std::fprintf(stderr, "troupe: dropped a frame at %s: %s\n", address.c_str(),
                     failure.text.c_str());
      });
  send_on(*coordinator, control_message({{"type", "hello"},
                                         {"address", own_address},
                                         {"host", host_name()},
                                         {"pid", ::getpid()},
                                         {"public_key", options.security.own.public_key}}));
  json assignment = wait_for(control, "assign", options.liveness.startup_s, clock);
  if (assignment.is_null()) {
    *error = "no assignment from the coordinator at " + options.coordinator_address + " within " +
             std::to_string(static_cast<int>(options.liveness.startup_s)) + " s";
    return 1;
  }
  auto stages = build_assigned_stages(assignment, options.security, context, clock, error);
  if (!stages) return 2;
  caf::actor_system_config settings;
  settings.set("scheduler.max-threads",
               std::max<int>(1, std::min<int>(static_cast<int>(stages->parts.size()),
                                              std::thread::hardware_concurrency())));
  caf::actor_system system{settings};
  caf::scoped_actor self{system};
  std::vector<std::pair<int, caf::actor>> actors;
  for (size_t i = 0; i < stages->parts.size(); ++i) {
    actors.push_back({stages->indices[i], system.spawn(stage_actor, stages->parts[i])});
  }
  routes.set(actors, assignment.value("job_id", uint64_t{0}));
  send_on(*coordinator, control_message({{"type", "ready"}, {"stages", stages->indices}}));
  const int status = serve(
      control, *coordinator, options, self, actors,
      [&] { return receiver.dropped() + routes.rejected(); }, clock, error);
  routes.set({}, 0);
  receiver.stop();
  for (auto& [stage, actor] : actors) caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
  return status;
}

namespace {

/// A worker as the coordinator knows it.
struct worker_peer {
  std::string address;
  std::string host;
  int64_t pid = 0;
  std::string public_key;  ///< with CURVE: what its inbox proves to hold
  std::optional<transport::outbox> control;
  std::vector<int> stages;
  double last_heard = 0;

  std::string describe() const {
    std::string text = "worker pid " + std::to_string(pid) + " on " + host + " (stage";
    text += stages.size() == 1 ? " " : "s ";
    for (size_t i = 0; i < stages.size(); ++i) {
      text += (i ? "," : "") + std::to_string(stages[i]);
    }
    return text + ")";
  }
};

/// Receives hellos on `in` until `count` workers have joined or the startup time is over.
bool gather_workers(transport::inbox& in, transport::transport_context& context, int count,
                    const liveness_settings& live, const transport::security_settings& security,
                    clock_source& clock, std::vector<worker_peer>* workers, std::string* error) {
  const double deadline = clock.now_seconds() + live.startup_s;
  while (static_cast<int>(workers->size()) < count) {
    const double left = deadline - clock.now_seconds();
    auto received = left > 0 ? in.receive(std::chrono::milliseconds(static_cast<int>(left * 1000)))
                             : std::nullopt;
    if (!received) {
      *error = "only " + std::to_string(workers->size()) + " of " + std::to_string(count) +
               " workers joined at " + in.address() + " within " +
               std::to_string(static_cast<int>(live.startup_s)) + " s";
      return false;
    }
    if (!received->ok()) continue;
    json body = control_body(*received->value);
    if (body.is_null() || body["type"] != "hello") continue;
    worker_peer peer;
    peer.address = body.value("address", "");
    peer.host = body.value("host", "?");
    peer.pid = body.value("pid", int64_t{0});
    peer.public_key = body.value("public_key", "");
    const auto& allowed = security.allowed_public_keys;
    if (security.curve &&
        std::find(allowed.begin(), allowed.end(), peer.public_key) == allowed.end()) {
      std::fprintf(stderr, "troupe: ignored a hello from %s: its key is not on the allow-list\n",
                   peer.host.c_str());
      continue;
    }
    peer.control = connect_outbox(context, peer.address, error, security, peer.public_key);
    if (!peer.control) return false;
    workers->push_back(std::move(peer));
  }
  return true;
}

/// Waits until every worker has said ready.
bool await_ready(transport::inbox& in, std::vector<worker_peer>& workers,
                 const liveness_settings& live, clock_source& clock, std::string* error) {
  size_t ready = 0;
  const double deadline = clock.now_seconds() + live.startup_s;
  while (ready < workers.size()) {
    const double left = deadline - clock.now_seconds();
    auto received = left > 0 ? in.receive(std::chrono::milliseconds(static_cast<int>(left * 1000)))
                             : std::nullopt;
    if (!received) {
      *error = std::to_string(workers.size() - ready) + " worker(s) did not get ready within " +
               std::to_string(static_cast<int>(live.startup_s)) + " s";
      return false;
    }
    if (received->ok() && control_body(*received->value).value("type", "") == "ready") ++ready;
  }
  for (auto& worker : workers) worker.last_heard = clock.now_seconds();
  return true;
}

/// Takes a report out of a control message when it is one.
void note_report(const transport::message& message, std::map<int, stage_report>* reports,
                 uint64_t* dropped) {
  json body = control_body(message);
  if (!body.is_null() && body["type"] == "report") {
    (*reports)[body.value("stage", -1)] = report_from(body, message);
    auto count = message.header.metrics.find("dropped");
    if (count != message.header.metrics.end()) *dropped += static_cast<uint64_t>(count->second);
  }
}

/// Heartbeats both ways until the run is done (true) or a worker goes silent (false).
bool watch(caf::scoped_actor& self, const caf::actor& coordinator, control_queue& control,
           std::vector<worker_peer>& workers, const liveness_settings& live, clock_source& clock,
           std::map<int, stage_report>* reports, uint64_t* dropped, std::string* error) {
  bool done = false;
  double last_sent = 0;
  while (!done) {
    self->receive(
        [&](done_atom) { done = true; },
        caf::after(std::chrono::milliseconds(static_cast<int64_t>(live.heartbeat_s * 500))) >>
            [] {});
    const double now = clock.now_seconds();
    while (auto message = control.pop(0)) {
      const int64_t pid = control_body(*message).value("pid", int64_t{-1});
      for (auto& worker : workers) {
        if (worker.pid == pid) worker.last_heard = now;
      }
      note_report(*message, reports, dropped);
    }
    if (now - last_sent >= live.heartbeat_s) {
      for (auto& worker : workers)
        send_on(*worker.control, control_message({{"type", "heartbeat"}}));
      last_sent = now;
    }
    for (const auto& worker : workers) {
      if (now - worker.last_heard > live.timeout_s) {
        *error = worker.describe() + " at " + worker.address + " stopped responding " +
                 std::to_string(static_cast<int>(now - worker.last_heard)) + " s ago";
        (void)coordinator;
        return false;
      }
    }
  }
  return true;
}

/// Waits for the stages' final reports (sent after "finish").
void collect_reports(control_queue& control, int stages, const liveness_settings& live,
                     clock_source& clock, std::map<int, stage_report>* reports, uint64_t* dropped) {
  const double deadline = clock.now_seconds() + live.timeout_s;
  while (static_cast<int>(reports->size()) < stages) {
    const double left = deadline - clock.now_seconds();
    if (left <= 0) return;
    auto message = control.pop(left);
    if (!message) return;
    note_report(*message, reports, dropped);
  }
}

/// Job ids for clusters: the coordinator's pid and a counter.
uint64_t fresh_cluster_job_id() {
  static std::atomic<uint64_t> counter{0};
  return (static_cast<uint64_t>(::getpid()) << 20) + (uint64_t{1} << 19) + counter.fetch_add(1);
}

/// Trains with the workers gathered and ready: the coordinator actor drives the run while this
/// thread exchanges heartbeats; then collects every stage's report.
std::optional<pipeline_report> drive(transport::transport_context& context, transport::inbox in,
                                     std::shared_ptr<coordinator_parts> coordinator,
                                     std::vector<worker_peer>& workers, int stages,
                                     const coordinator_options& options, clock_source& clock,
                                     std::string* error) {
  caf::actor_system_config settings;
  settings.set("scheduler.max-threads", 1);
  caf::actor_system system{settings};
  caf::scoped_actor self{system};
  coordinator->listener = caf::actor{self};
  caf::actor handle = system.spawn(coordinator_actor, coordinator);
  control_queue control;
  std::vector<transport::inbox> inboxes;
  inboxes.push_back(std::move(in));
  transport::receiver_thread receiver(
      context, std::move(inboxes),
      [&](transport::message&& message) {
        if (is_control(message)) {
          control.push(std::move(message));
        } else {
          caf::anon_send(handle, std::move(message));
        }
      },
      [](const std::string& address, const transport::decode_error& failure) {
        std::fprintf(stderr, "troupe: dropped a frame at %s: %s\n", address.c_str(),
                     failure.text.c_str());
      });
  caf::anon_send(handle, start_atom::value);
  std::map<int, stage_report> reports;
  uint64_t dropped = 0;
  const bool trained =
      watch(self, handle, control, workers, options.liveness, clock, &reports, &dropped, error);
  for (worker_peer& worker : workers)
    send_on(*worker.control, control_message({{"type", "finish"}}));
  if (trained) collect_reports(control, stages, options.liveness, clock, &reports, &dropped);
  receiver.stop();
  caf::anon_send_exit(handle, caf::exit_reason::user_shutdown);
  if (!trained) return std::nullopt;
  if (static_cast<int>(reports.size()) < stages) {
    *error = "only " + std::to_string(reports.size()) + " of " + std::to_string(stages) +
             " stages reported at the end of the run";
    return std::nullopt;
  }
  pipeline_report report;
  report.summary = coordinator->run->summary();
  for (auto& [stage, stage_result] : reports) report.stages.push_back(std::move(stage_result));
  report.dropped_frames = dropped + receiver.dropped();
  return report;
}

}  // namespace

std::optional<pipeline_report> run_coordinator(const job_config& config, const job_data& data,
                                               const coordinator_options& options,
                                               training_observer& observer, clock_source& clock,
                                               std::string* error) {
  auto ranges = partition_model(config, error);
  if (!ranges) return std::nullopt;
  const int stages = static_cast<int>(ranges->size());
  if (options.workers < 1 || options.workers > stages) {
    *error = std::to_string(options.workers) + " workers for " + std::to_string(stages) +
             " stages: every worker must host at least one stage";
    return std::nullopt;
  }
  transport::transport_context context;
  auto authenticator = start_authenticator(context, options.security, error);
  if (options.security.curve && !authenticator) return std::nullopt;
  transport::endpoint_error problem;
  auto in = transport::inbox::bind(context, options.listen_address,
                                   endpoint_settings(options.security), &problem);
  if (!in) {
    *error = problem.text;
    return std::nullopt;
  }
  std::vector<worker_peer> workers;
  if (!gather_workers(*in, context, options.workers, options.liveness, options.security, clock,
                      &workers, error)) {
    return std::nullopt;
  }
  auto coordinator = std::make_shared<coordinator_parts>();
  coordinator->job_id = fresh_cluster_job_id();
  coordinator->host = layers::create_backend("cpu", 1, error);
  coordinator->run =
      std::make_unique<training_run>(config, data.train, data.test, *coordinator->host, observer);
  coordinator->clock = &clock;
  coordinator->trace = options.pipeline.trace;
  std::vector<std::string> addresses(stages), keys(stages);
  for (int s = 0; s < stages; ++s) {
    worker_peer& owner = workers[static_cast<size_t>(s) * workers.size() / stages];
    owner.stages.push_back(s);
    addresses[s] = owner.address;
    keys[s] = owner.public_key;
  }
  for (worker_peer& worker : workers) {
    send_on(*worker.control,
            control_message({{"type", "assign"},
                             {"job_toml", options.job_toml},
                             {"overrides", options.overrides},
                             {"stages", worker.stages},
                             {"addresses", addresses},
                             {"keys", keys},
                             {"coordinator", in->address()},
                             {"coordinator_key", options.security.own.public_key},
                             {"job_id", coordinator->job_id},
                             {"steps_per_epoch", coordinator->run->steps_per_epoch()},
                             {"total_steps", coordinator->run->total_steps()}}));
  }
  if (!await_ready(*in, workers, options.liveness, clock, error)) return std::nullopt;
  coordinator->first_stage =
      connect_outbox(context, addresses[0], error, options.security, keys[0]);
  if (!coordinator->first_stage) return std::nullopt;
  return drive(context, std::move(*in), coordinator, workers, stages, options, clock, error);
}

}  // namespace troupe::actors
