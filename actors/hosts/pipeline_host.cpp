#include "actors/hosts/pipeline_host.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <numeric>
#include <thread>

#include "actors/engine/partition.h"
#include "actors/hosts/actor_hosting.h"
#include "actors/hosts/pipeline_test_seam.h"
#include "actors/hosts/replica_groups.h"
#include "layers/backend_registry.h"

namespace troupe::actors {

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

namespace {

std::string coordinator_address(const std::string& prefix) { return prefix + "/coordinator"; }

/// A job id unique within this machine's running processes.
uint64_t fresh_job_id() {
  static std::atomic<uint64_t> counter{0};
  return (static_cast<uint64_t>(::getpid()) << 20) + counter.fetch_add(1);
}

/// Binds an inbox per stage and one for the coordinator under `prefix`.
bool bind_inboxes(transport::transport_context& context, const address_book& addresses,
                  std::vector<transport::inbox>* inboxes, std::string* error) {
  std::vector<std::string> all = addresses.stages;
  all.push_back(addresses.coordinator);
  for (const std::string& address : all) {
    transport::endpoint_error problem;
    auto in = transport::inbox::bind(context, address, endpoint_settings(), &problem);
    if (!in) {
      *error = problem.text;
      return false;
    }
    inboxes->push_back(std::move(*in));
  }
  return true;
}

/// Closes the outboxes of the stages and the coordinator when it goes, so that the transport
/// context, destroyed right after it, can end.
class outbox_closer {
 public:
  outbox_closer(std::vector<std::shared_ptr<stage_parts>>& parts,
                std::shared_ptr<coordinator_parts>& coordinator)
      : parts_(parts), coordinator_(coordinator) {}
  ~outbox_closer() {
    for (auto& stage : parts_) {
      if (stage) close_outboxes(*stage);
    }
    if (coordinator_) {
      coordinator_->stages.clear();
      coordinator_->stage_readers.clear();
      coordinator_->inbox.reset();
    }
  }
  outbox_closer(const outbox_closer&) = delete;
  outbox_closer& operator=(const outbox_closer&) = delete;

 private:
  std::vector<std::shared_ptr<stage_parts>>& parts_;
  std::shared_ptr<coordinator_parts>& coordinator_;
};

/// Hands each inbox to its actor (`targets`: the stages', then the coordinator's) and tells
/// every sender which actor reads the inbox it sends to. No receiver thread sits between them:
/// the sending actor's thread queues the frames on ZeroMQ and tells the reader, which takes
/// them on its own thread (a stage with a core to itself) or on the scheduler thread that
/// picks it (often the sender's own, just freed).
void connect_readers(std::vector<std::shared_ptr<stage_parts>>& parts,
                     coordinator_parts& coordinator, const std::vector<caf::actor>& targets,
                     std::vector<transport::inbox>& inboxes) {
  const size_t actors = parts.size();
  for (size_t s = 0; s < actors; ++s) {
    stage_parts& stage = *parts[s];
    stage.inbox = std::move(inboxes[s]);
    if (stage.next) stage.next_reader = targets[s + 1];
    if (stage.previous) stage.previous_reader = targets[s - 1];
    if (stage.replica_next) stage.replica_next_reader = targets[stage.replica_next_index];
    stage.coordinator_reader = targets[actors];
  }
  coordinator.inbox = std::move(inboxes[actors]);
  coordinator.stage_readers.assign(targets.begin(), targets.begin() + actors);
}

}  // namespace

process_usage this_process_usage(const std::string& role, std::vector<int> stages) {
  process_usage usage;
  usage.role = role;
  usage.host = host_name();
  usage.pid = ::getpid();
  usage.stages = std::move(stages);
  rusage self{};
  if (getrusage(RUSAGE_SELF, &self) == 0) {
    const auto seconds = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
    };
    usage.user_s = seconds(self.ru_utime);
    usage.system_s = seconds(self.ru_stime);
    usage.voluntary_switches = self.ru_nvcsw;
    usage.involuntary_switches = self.ru_nivcsw;
  }
  return usage;
}

nlohmann::json to_json(const process_usage& usage) {
  return {{"role", usage.role},
          {"host", usage.host},
          {"pid", usage.pid},
          {"stages", usage.stages},
          {"user_s", usage.user_s},
          {"system_s", usage.system_s},
          {"voluntary_switches", usage.voluntary_switches},
          {"involuntary_switches", usage.involuntary_switches}};
}

process_usage process_usage_from_json(const nlohmann::json& json) {
  const auto field = [&](const char* name) {
    return json.is_object() && json.contains(name) ? json[name] : nlohmann::json();
  };
  const auto number = [&](const char* name) {
    const nlohmann::json value = field(name);
    return value.is_number() ? value.get<double>() : 0.0;
  };
  const auto text = [&](const char* name) {
    const nlohmann::json value = field(name);
    return value.is_string() ? value.get<std::string>() : std::string();
  };
  process_usage usage;
  usage.role = text("role");
  usage.host = text("host");
  usage.pid = static_cast<int64_t>(number("pid"));
  const nlohmann::json stages = field("stages");
  if (stages.is_array()) {
    for (const nlohmann::json& stage : stages) {
      if (stage.is_number_integer()) usage.stages.push_back(stage.get<int>());
    }
  }
  usage.user_s = number("user_s");
  usage.system_s = number("system_s");
  usage.voluntary_switches = static_cast<int64_t>(number("voluntary_switches"));
  usage.involuntary_switches = static_cast<int64_t>(number("involuntary_switches"));
  return usage;
}

std::optional<pipeline_report> run_pipeline(const job_config& config, const job_data& data,
                                            training_observer& observer, clock_source& clock,
                                            const pipeline_options& options, std::string* error) {
  return run_pipeline_with_hook(config, data, observer, clock, options, {}, error);
}

std::optional<pipeline_report> run_pipeline_with_hook(
    const job_config& config, const job_data& data, training_observer& observer,
    clock_source& clock, const pipeline_options& options, const stage_message_hook& hook,
    std::string* error) {
  auto ranges = partition_model(config, error);
  if (!ranges) return std::nullopt;
  const int stages = stage_actor_count(config);  // every replica's
  // Messages still queued when the run ends (a failed run leaves keys in flight) hold tensors
  // and pinned buffers of the stages' and the coordinator's backends until ZeroMQ drops them as
  // the context ends. So the parts, which own the backends, are declared before the context
  // and go after it; the closer, declared after it, closes their sockets first.
  std::vector<std::shared_ptr<stage_parts>> parts;
  std::shared_ptr<coordinator_parts> coordinator;
  transport::transport_context context;
  outbox_closer closer(parts, coordinator);
  const uint64_t job_id = fresh_job_id();
  const std::string prefix = transport::inproc_prefix(job_id);
  address_book addresses;
  for (int s = 0; s < stages; ++s) addresses.stages.push_back(transport::stage_address(prefix, s));
  addresses.coordinator = coordinator_address(prefix);
  std::vector<transport::inbox> inboxes;
  if (!bind_inboxes(context, addresses, &inboxes, error)) return std::nullopt;

  coordinator = make_coordinator_parts(config, data, options, observer, clock, error);
  if (!coordinator) return std::nullopt;
  coordinator->job_id = job_id;
  for (int s = 0; s < stages; ++s) {
    coordinator->stages.push_back(connect_outbox(context, addresses.stages[s], error));
    if (!coordinator->stages.back()) return std::nullopt;
  }

  std::vector<std::shared_ptr<pass_turn>> turns;
  for (int s = 0; s < stages; ++s) {
    // Each replica's workers keep their own order of passes.
    if (stage_of_actor(config, s) == 0) turns = make_pass_turns(config);
    parts.push_back(make_stage_parts(
        config, (*ranges)[stage_of_actor(config, s)], s, coordinator->run->steps_per_epoch(),
        coordinator->run->total_steps(), turns, context, addresses, error));
    if (!parts.back()) return std::nullopt;
    parts.back()->job_id = job_id;
    parts.back()->clock = &clock;
    parts.back()->trace = options.trace;
    parts.back()->monitor = options.monitor;
    parts.back()->fault_hook = hook;
    parts.back()->collect_weights = options.collect_weights;
  }

  if (uses_replica_groups(config)) {
    std::string problem = replica_group_problem(config, true);
    const std::vector<std::string> ids =
        problem.empty() ? make_replica_group_ids(config, &problem) : std::vector<std::string>{};
    if (!problem.empty()) return *error = problem, std::nullopt;
    if (!join_replica_groups(config, parts, ids, replica_group_join_timeout_s, error)) {
      return std::nullopt;
    }
  }

  caf::actor_system_config settings;
  // Stages on threads of their own leave the scheduler the coordinator; else one scheduler
  // thread per worker (the interleaved schedule's workers run several stages). A stage whose
  // collectives block until its peers come needs a thread that no peer waits for.
  const bool own_threads = stages_get_own_threads(parts.size()) || uses_replica_groups(config);
  configure_scheduler(
      settings, own_threads ? 1
                            : std::min<int>(pipeline_workers(config) * config.parallelism.replicas,
                                            std::thread::hardware_concurrency()));
  caf::actor_system system{settings};
  caf::scoped_actor self{system};
  coordinator->listener = caf::actor{self};
  std::vector<caf::actor> targets;
  for (auto& stage : parts) targets.push_back(spawn_stage_actor(system, stage, own_threads));
  caf::actor coordinator_handle = system.spawn(coordinator_actor, coordinator);
  targets.push_back(coordinator_handle);
  connect_readers(parts, *coordinator, targets, inboxes);
  connect_worker_siblings(config, parts, targets);
  caf::anon_send(coordinator_handle, start_atom::value);
  if (options.monitor) {
    std::vector<int> all(static_cast<size_t>(stages));
    std::iota(all.begin(), all.end(), 0);
    options.monitor->set_processes(
        {{"this process", host_name(), static_cast<int64_t>(::getpid()), all, std::nullopt}}, 0);
  }
  await_run(self, coordinator_handle, options, config.metrics.stall_timeout_s, clock);

  pipeline_report report;
  report.summary = coordinator->run->summary();
  report.stopped = coordinator->run->stopped();
  const bool failed = !coordinator->failure.empty();
  if (!failed) {
    for (int s = 0; s < stages; ++s) {
      self->request(targets[s], caf::infinite, collect_atom::value)
          .receive([&](const stage_report& stage) { report.stages.push_back(stage); },
                   [&](const caf::error&) { report.stages.emplace_back(); });
    }
  }
  // A stage's send never waits (the high-water marks are far above what admission lets in),
  // so an actor in the middle of sending finishes although nobody reads its peers' inboxes.
  for (auto& target : targets) {
    self->send_exit(target, caf::exit_reason::user_shutdown);
    self->wait_for(target);
  }
  // The parts and `targets` hold the stage actors' handles; a detached actor's thread ends only
  // once its actor is gone.
  release_actor_handles(parts);
  coordinator->stage_readers.clear();
  targets.clear();
  if (failed) {
    *error = coordinator->failure;
    return std::nullopt;
  }
  report.dropped_frames = coordinator->dropped_frames;
  for (auto& stage : parts) report.dropped_frames += stage->dropped_frames;
  std::vector<int> all_stages(static_cast<size_t>(stages));
  std::iota(all_stages.begin(), all_stages.end(), 0);
  report.processes.push_back(this_process_usage("process", all_stages));
  return report;
}

}  // namespace troupe::actors
