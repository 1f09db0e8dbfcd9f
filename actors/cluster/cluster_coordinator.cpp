// The coordinator half of the cluster host: gathers workers, assigns them stages, drives the
// run through the coordinator actor, watches heartbeats, and when a worker is lost resets the
// pipeline, brings in a replacement and continues from the latest checkpoint.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <random>

#include "actors/cluster/cluster_control.h"
#include "actors/cluster/cluster_host.h"
#include "actors/cluster/worker_peers.h"
#include "actors/cluster/worker_reports.h"
#include "actors/cluster/worker_traces.h"
#include "actors/config/job_file.h"
#include "actors/engine/partition.h"
#include "actors/engine/recovery.h"
#include "actors/hosts/actor_hosting.h"
#include "actors/hosts/replica_groups.h"
#include "actors/hosts/wire_format.h"

namespace troupe::actors {
namespace {

using json = nlohmann::json;

/// Job ids for clusters, a new one per generation: 64 random bits (never 0). Workers and the
/// coordinator drop every data message of another id, so the id is what keeps a process that
/// did not join the run from injecting keys or losses; one made of the coordinator's pid and a
/// counter could be guessed by anyone who can list processes.
uint64_t fresh_cluster_job_id() {
  std::random_device entropy;  // the kernel's random source
  const uint64_t id = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  return id == 0 ? 1 : id;
}

class cluster_coordinator {
 public:
  cluster_coordinator(const job_config& config, const job_data& data,
                      const coordinator_options& options, training_observer& observer,
                      clock_source& clock, int stages)
      : config_(config),
        data_(data),
        options_(options),
        observer_(observer),
        clock_(clock),
        stages_(stages),
        system_(single_thread(settings_)),
        self_(system_) {}

  ~cluster_coordinator() {
    stop_generation();
    if (receiver_) receiver_->stop();
  }

  std::optional<pipeline_report> run(std::string* error) {
    if (!bind(error) || !gather(options_.workers, options_.liveness.startup_s, error) ||
        !start_generation(options_.pipeline.resume, error)) {
      finish_workers();
      return std::nullopt;
    }
    for (;;) {
      size_t lost = 0;
      const outcome result = watch(&lost, error);
      if (result == outcome::done) break;
      if (result == outcome::failed || !recover(lost, error)) {
        finish_workers();
        return std::nullopt;
      }
    }
    finish_workers();
    collect_reports();
    if (options_.pipeline.trace) worker_traces_.merge_into(*options_.pipeline.trace, stages_);
    if (reports_.stages_reported() < stages_) {
      *error = "only " + std::to_string(reports_.stages_reported()) + " of " +
               std::to_string(stages_) + " stages reported at the end of the run";
      return std::nullopt;
    }
    pipeline_report report;
    report.summary = parts_->run->summary();
    report.stopped = parts_->run->stopped();
    report.dropped_frames = receiver_->dropped();
    report.dropped_control_messages = dropped_control_;
    report.processes.push_back(this_process_usage("coordinator", {}));
    reports_.move_into(&report);
    return report;
  }

 private:
  enum class outcome { done, worker_lost, failed };

  static caf::actor_system_config& single_thread(caf::actor_system_config& settings) {
    configure_scheduler(settings, 1);
    return settings;
  }

  bool bind(std::string* error) {
    authenticator_ = start_authenticator(context_, options_.security, error);
    if (options_.security.curve && !authenticator_) return false;
    transport::endpoint_error problem;
    auto in = transport::inbox::bind(context_, options_.listen_address,
                                     endpoint_settings(options_.security), &problem);
    if (!in) {
      *error = problem.text;
      return false;
    }
    address_ = in->address();
    std::vector<transport::inbox> inboxes;
    inboxes.push_back(std::move(*in));
    receiver_ = std::make_unique<transport::receiver_thread>(
        context_, std::move(inboxes),
        [this](transport::message&& message) {
          if (is_control(message)) {
            control_.push(std::move(message), clock_.now_seconds());
            return;
          }
          std::lock_guard<std::mutex> lock(route_mutex_);
          if (current_) caf::anon_send(current_, std::move(message));
        },
        log_dropped_frame);
    return true;
  }

  // Control messages ------------------------------------------------------------------------

  /// Handles every control message that arrives within `wait_s` (and those already queued).
  void take_control(double wait_s) {
    auto message = control_.pop(wait_s);
    while (message) {
      json body = control_body(*message, &dropped_control_);
      try {
        if (!body.is_null()) handle_control(body, *message);
      } catch (const json::exception& failure) {
        // control_body() checked every field's kind; this is the net under that check.
        std::fprintf(stderr, "troupe: dropped a control message from %s: %s\n",
                     body.value("address", std::string("?")).c_str(), failure.what());
        ++dropped_control_;
      }
      message = control_.pop(0);
    }
  }

  void handle_control(const json& body, const transport::message& message) {
    const std::string type = body["type"];
    worker_peer* worker = find_worker(workers_, body.value("address", std::string()));
    if (worker) {
      worker->last_heard = clock_.now_seconds();
      if (json stamped = clock_stamps(body); !stamped.is_null()) worker->echo = stamped;
    }
    if (type == "hello") {
      admit_hello(body);
    } else if (!worker) {
      // Only hellos come from peers that are not workers of this run.
      if (type != "heartbeat") {
        ++dropped_control_;
        std::fprintf(stderr, "troupe: dropped a %s from %s: not a worker of this run\n",
                     type.c_str(),
                     body.value("address", std::string("a peer without an address")).c_str());
      }
    } else if (type == "heartbeat") {
      keep_activity(*worker, body);
    } else if (type == "ready" && body.value("job_id", uint64_t{0}) == job_id_) {
      ++ready_;
    } else if (type == "report") {
      reports_.keep_report(*worker, body, message);
    } else if (type == "trace") {
      if (options_.pipeline.trace) worker_traces_.keep(body, message, stages_);
    } else if (type == "usage") {
      reports_.keep_usage(body);
    } else if (type == "stop") {
      // A launcher's SIGTERM reaches every task: a worker passes its own on, so that the run
      // checkpoints and stops cleanly rather than losing the worker.
      if (!worker_asked_to_stop_) {
        worker_asked_to_stop_ = true;
        worker_stop_requests_.store(2);
        std::fprintf(stderr, "troupe: worker pid %lld on %s: %s; checkpointing and stopping\n",
                     static_cast<long long>(worker->pid), worker->host.c_str(),
                     body.value("reason", std::string("it asked to stop")).c_str());
      }
    }
  }

  /// Passes what a worker's heartbeat says its stages do on to the run's monitor.
  void keep_activity(const worker_peer& worker, const json& body) {
    run_monitor* monitor = options_.pipeline.monitor;
    if (monitor == nullptr || !body.contains("activity")) return;
    std::string problem;
    if (!monitor->add_heartbeat(body, worker.stages, clock_.now_seconds(), &problem)) {
      ++dropped_control_;
      std::fprintf(stderr, "troupe: ignored the stage activity in a heartbeat from %s: %s\n",
                   worker.describe().c_str(), problem.c_str());
    }
  }

  /// Tells the run's monitor which worker hosts which stages.
  void publish_workers() {
    run_monitor* monitor = options_.pipeline.monitor;
    if (monitor == nullptr) return;
    monitor->set_processes(hosting_processes(workers_), recovery_.restarts());
  }

  /// Checks a hello (protocol version, job identity, CURVE key) and adds its worker, or
  /// tells it why not.
  void admit_hello(const json& body) {
    worker_peer peer = peer_from_hello(body);
    if (!options_.run_secret.empty() &&
        !same_secret(body.value("secret", ""), options_.run_secret)) {
      // Not even a refusal: answering would open a socket for whoever asked.
      std::fprintf(
          stderr, "troupe: ignored a hello from %s (pid %lld): it does not know the run's secret\n",
          peer.host.c_str(), static_cast<long long>(peer.pid));
      return;
    }
    const auto& allowed = options_.security.allowed_public_keys;
    if (options_.security.curve &&
        std::find(allowed.begin(), allowed.end(), peer.public_key) == allowed.end()) {
      std::fprintf(stderr, "troupe: ignored a hello from %s: its key is not on the allow-list\n",
                   peer.host.c_str());
      return;
    }
    std::string refusal = hello_refusal(
        body, options_.job_hash.empty() ? job_identity_hash(config_) : options_.job_hash);
    // A job with all its workers may be about to lose one: a launcher that restarts a rank at
    // once (Slurm, Kubernetes) says hello before the heartbeats tell the loss. Such a worker of
    // this job is asked to try again, and joins once the loss is known.
    const bool full = refusal.empty() && static_cast<int>(workers_.size()) >= expected_workers_;
    if (full) refusal = "the job already has its " + std::to_string(expected_workers_) + " workers";
    if (!refusal.empty()) {
      std::fprintf(stderr, "troupe: %s worker pid %lld on %s: %s\n",
                   full ? "asked to retry" : "refused", static_cast<long long>(peer.pid),
                   peer.host.c_str(), refusal.c_str());
      refuse(peer, refusal, full ? options_.liveness.heartbeat_s * 2 : 0);
      return;
    }
    std::string error;
    peer.control =
        connect_outbox(context_, peer.address, &error, options_.security, peer.public_key);
    if (!peer.control) {
      std::fprintf(stderr, "troupe: ignored a hello from %s: %s\n", peer.host.c_str(),
                   error.c_str());
      return;
    }
    peer.last_heard = clock_.now_seconds();
    workers_.push_back(std::move(peer));
  }

  /// Tells `peer` why it may not join (and, with `retry_s` > 0, to say hello again after that
  /// long), on a socket of its own that closes at once: ZeroMQ delivers the refusal within the
  /// linger and then frees the socket, so a flood of hellos holds no file open for longer.
  void refuse(const worker_peer& peer, const std::string& reason, double retry_s) {
    transport::endpoint_options settings = endpoint_settings(options_.security);
    settings.security.server_public_key = peer.public_key;
    settings.linger_ms = refusal_linger_ms;
    auto out = transport::outbox::connect(context_, peer.address, settings, nullptr);
    json body = {{"type", "refuse"}, {"reason", reason}};
    if (retry_s > 0) body["retry_s"] = retry_s;
    if (out) send_on(*out, control_message(body));
  }

  /// `body` with the echo of `worker`'s last stamps and this clock as it leaves.
  json with_stamps(json body, const worker_peer& worker) {
    return actors::with_stamps(std::move(body), worker, clock_.now_seconds());
  }

  void heartbeat_workers(double now) {
    if (now - last_heartbeat_ < options_.liveness.heartbeat_s) return;
    for (auto& worker : workers_) {
      send_on(*worker.control, control_message(with_stamps({{"type", "heartbeat"}}, worker)));
    }
    last_heartbeat_ = now;
  }

  /// A joined worker whose process has ended or that has been silent past the timeout, with
  /// `reason` saying which.
  std::optional<size_t> ended_worker(double now, std::string* reason) {
    if (options_.exited_workers) {
      for (exited_worker& process : options_.exited_workers()) {
        ended_processes_.push_back(std::move(process));
      }
    }
    return actors::ended_worker(workers_, &ended_processes_, now, options_.liveness.timeout_s,
                                reason);
  }

  // Generations -----------------------------------------------------------------------------

  /// Waits for hellos until `count` workers have joined, within `seconds`.
  bool gather(int count, double seconds, std::string* error) {
    expected_workers_ = count;
    const double deadline = clock_.now_seconds() + seconds;
    while (static_cast<int>(workers_.size()) < count) {
      const double now = clock_.now_seconds();
      if (now >= deadline) {
        *error = "only " + std::to_string(workers_.size()) + " of " + std::to_string(count) +
                 " workers joined at " + address_ + " within " +
                 std::to_string(static_cast<int>(seconds)) + " s";
        return false;
      }
      take_control(std::min(options_.liveness.heartbeat_s / 2, deadline - now));
      heartbeat_workers(clock_.now_seconds());
      std::string reason;
      if (auto lost = ended_worker(clock_.now_seconds(), &reason)) {
        std::fprintf(stderr, "troupe: %s at %s %s while the job was starting\n",
                     workers_[*lost].describe().c_str(), workers_[*lost].address.c_str(),
                     reason.c_str());
        workers_.erase(workers_.begin() + static_cast<std::ptrdiff_t>(*lost));
        if (options_.replace_worker && !options_.replace_worker(error)) return false;
      }
    }
    return true;
  }

  /// Assigns the stages to the workers, waits until they are ready, and starts a coordinator
  /// actor (continuing from `resume` when given).
  bool start_generation(const std::optional<loaded_checkpoint>& resume, std::string* error) {
    job_id_ = fresh_cluster_job_id();
    std::vector<std::string> addresses(stages_), keys(stages_);
    for (auto& worker : workers_) worker.stages.clear();
    for (int s = 0; s < stages_; ++s) {
      worker_peer& owner =
          workers_[process_of_stage(config_, s, static_cast<int>(workers_.size()))];
      owner.stages.push_back(s);
      addresses[s] = owner.address;
      keys[s] = owner.public_key;
    }
    pipeline_options pipeline = options_.pipeline;
    pipeline.resume = resume;
    auto parts = make_coordinator_parts(config_, data_, pipeline, observer_, clock_, error);
    if (!parts) return false;
    parts->job_id = job_id_;
    parts->listener = caf::actor{self_};
    // Fresh NCCL groups for every generation: a lost peer leaves the old ones broken.
    std::string no_ids;
    const std::vector<std::string> group_ids = make_replica_group_ids(config_, &no_ids);
    if (!no_ids.empty()) return *error = no_ids, false;
    for (worker_peer& worker : workers_) {
      json assignment = {{"type", "assign"},
                         {"job_toml", options_.job_toml},
                         {"overrides", options_.overrides},
                         {"stages", worker.stages},
                         {"addresses", addresses},
                         {"keys", keys},
                         {"coordinator", address_},
                         {"coordinator_key", options_.security.own.public_key},
                         {"job_id", job_id_},
                         {"steps_per_epoch", parts->run->steps_per_epoch()},
                         {"total_steps", parts->run->total_steps()},
                         {"group_ids", group_ids}};
      send_on(*worker.control, control_message(with_stamps(assignment, worker)));
    }
    ready_ = 0;
    const double deadline = clock_.now_seconds() + options_.liveness.startup_s;
    while (ready_ < workers_.size()) {
      const double now = clock_.now_seconds();
      if (now >= deadline) {
        *error = std::to_string(workers_.size() - ready_) + " worker(s) did not get ready within " +
                 std::to_string(static_cast<int>(options_.liveness.startup_s)) + " s";
        return false;
      }
      take_control(std::min(options_.liveness.heartbeat_s / 2, deadline - now));
      heartbeat_workers(clock_.now_seconds());
    }
    for (auto& worker : workers_) worker.last_heard = clock_.now_seconds();
    for (int s = 0; s < stages_; ++s) {
      parts->stages.push_back(
          connect_outbox(context_, addresses[s], error, options_.security, keys[s]));
      if (!parts->stages.back()) return false;
    }
    parts_ = parts;
    caf::actor handle = system_.spawn(coordinator_actor, parts);
    {
      std::lock_guard<std::mutex> lock(route_mutex_);
      current_ = handle;
    }
    caf::anon_send(handle, start_atom::value);
    return true;
  }

  void stop_generation() {
    caf::actor old;
    {
      std::lock_guard<std::mutex> lock(route_mutex_);
      std::swap(old, current_);
    }
    if (old) {
      self_->send_exit(old, caf::exit_reason::user_shutdown);
      self_->wait_for(old);
    }
    // Keys queued for a lost stage hold tensors of this coordinator's host backend until
    // ZeroMQ drops them: close the sockets now, free the backend after the context has ended.
    if (parts_) {
      parts_->stages.clear();
      retired_.push_back(parts_);
    }
  }

  /// Heartbeats both ways until the run is done, fails, or a worker goes silent.
  outcome watch(size_t* lost, std::string* error) {
    for (;;) {
      bool done = false;
      self_->receive([&](done_atom) { done = true; },
                     caf::after(std::chrono::milliseconds(
                         static_cast<int64_t>(options_.liveness.heartbeat_s * 500))) >>
                         [] {});
      if (done && !parts_->failure.empty()) {
        *error = parts_->failure;
        return outcome::failed;
      }
      if (done && parts_->run->finished()) return outcome::done;
      forward_checkpoint_request(self_, current_, options_.pipeline.checkpoint_requests);
      forward_checkpoint_request(self_, current_, &worker_stop_requests_);
      take_control(0);
      publish_workers();
      watch_run(self_, current_, options_.pipeline, config_.metrics.stall_timeout_s, clock_);
      const double now = clock_.now_seconds();
      heartbeat_workers(now);
      std::string reason;
      if (auto ended = ended_worker(now, &reason)) {
        *lost = *ended;
        const worker_peer& worker = workers_[*ended];
        *error = worker.describe() + " at " + worker.address + " " + reason;
        return outcome::worker_lost;
      }
    }
  }

  /// Resets the pipeline after losing worker `lost`, brings in a replacement and continues
  /// from the latest checkpoint. False, with `error` set, when that is not possible.
  bool recover(size_t lost, std::string* error) {
    nlohmann::json event;
    std::string reason;
    const worker_peer& lost_peer = workers_[lost];
    if (!recovery_.lost({{"worker", lost_peer.describe()}, {"address", lost_peer.address}},
                        lost_peer.stages, clock_.now_seconds(), &event, &reason)) {
      if (recovery_.limit() > 0) *error += ", " + reason;
      return false;
    }
    stop_generation();
    workers_.erase(workers_.begin() + static_cast<std::ptrdiff_t>(lost));
    std::fprintf(stderr, "troupe: %s; restarting from the latest checkpoint (restart %d of %d)\n",
                 error->c_str(), recovery_.restarts(), recovery_.limit());
    observer_.on_event(event);
    error->clear();
    for (auto& worker : workers_)
      send_on(*worker.control, control_message({{"type", "reset"}, {"job_id", job_id_}}));
    if (options_.replace_worker && !options_.replace_worker(error)) return false;
    if (!gather(options_.workers, config_.checkpoint.rejoin_timeout_s, error)) return false;
    std::optional<loaded_checkpoint> checkpoint = options_.pipeline.resume;
    if (!options_.pipeline.checkpoint_directory.empty()) {
      std::vector<std::string> problems;
      checkpoint_store store(options_.pipeline.checkpoint_directory, 0);
      auto latest = store.load_latest(checkpoint_config_hash(config_), &problems);
      for (const std::string& problem : problems) {
        std::fprintf(stderr, "troupe: skipped a checkpoint: %s\n", problem.c_str());
      }
      if (latest) checkpoint = std::move(latest);
    }
    if (!start_generation(checkpoint, error)) return false;
    const int64_t step = checkpoint ? checkpoint->manifest.step : 0;
    const nlohmann::json recovered = recovery_.recovered(step, clock_.now_seconds());
    std::fprintf(stderr, "troupe: recovered in %.1f s; continuing from step %lld\n",
                 recovered["seconds"].get<double>(), static_cast<long long>(step));
    observer_.on_event(recovered);
    return true;
  }

  void finish_workers() {
    stop_generation();
    for (worker_peer& worker : workers_) {
      send_on(*worker.control,
              control_message(with_stamps({{"type", "finish"}, {"job_id", job_id_}}, worker)));
    }
  }

  /// Waits for the stages' final reports (sent after "finish").
  void collect_reports() {
    const double deadline = clock_.now_seconds() + options_.liveness.timeout_s;
    while (reports_.stages_reported() < stages_) {
      const double left = deadline - clock_.now_seconds();
      if (left <= 0) return;
      take_control(std::min(left, 0.05));
    }
  }

  const job_config& config_;
  const job_data& data_;
  const coordinator_options& options_;
  training_observer& observer_;
  clock_source& clock_;
  const int stages_;
  std::vector<std::shared_ptr<coordinator_parts>> retired_;  ///< outlives context_
  transport::transport_context context_;
  std::unique_ptr<transport::zap_authenticator> authenticator_;
  std::string address_;
  control_queue control_;
  std::vector<worker_peer> workers_;
  std::vector<exited_worker> ended_processes_;  ///< reported by options_.exited_workers
  static constexpr int refusal_linger_ms = 2000;
  int expected_workers_ = 0;
  caf::actor_system_config settings_;  ///< the actor system keeps a reference to it
  caf::actor_system system_;
  caf::scoped_actor self_;
  std::mutex route_mutex_;
  caf::actor current_;  ///< the coordinator actor of the current generation
  std::shared_ptr<coordinator_parts> parts_;
  uint64_t job_id_ = 0;
  uint64_t dropped_control_ = 0;  ///< malformed control messages, or from strangers
  /// 2 once a worker asked to stop the run, until passed on to the coordinator actor (as
  /// pipeline_options::checkpoint_requests is).
  std::atomic<int> worker_stop_requests_{0};
  bool worker_asked_to_stop_ = false;
  size_t ready_ = 0;
  double last_heartbeat_ = 0;
  recovery recovery_{config_.checkpoint.max_restarts};
  worker_reports reports_;  ///< the stages' final reports and the workers' usage
  worker_traces worker_traces_;
  // Last: stopped first, before what its callback touches goes away.
  std::unique_ptr<transport::receiver_thread> receiver_;
};

}  // namespace

std::optional<pipeline_report> run_coordinator(const job_config& config, const job_data& data,
                                               const coordinator_options& options,
                                               training_observer& observer, clock_source& clock,
                                               std::string* error) {
  auto ranges = partition_model(config, error);
  if (!ranges) return std::nullopt;
  const int stages = stage_actor_count(config);  // every replica's
  if (options.workers < 1 || options.workers > stages) {
    *error = std::to_string(options.workers) + " workers for " + std::to_string(stages) +
             " stages: every worker must host at least one stage";
    return std::nullopt;
  }
  cluster_coordinator coordinator(config, data, options, observer, clock, stages);
  return coordinator.run(error);
}

}  // namespace troupe::actors
