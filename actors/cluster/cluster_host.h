#pragma once

// The engine across processes: a coordinator process that ships the job to worker processes
// and drives it, and worker processes that host stages. The same actors and frames as in one
// process, over ipc:// or tcp:// instead of inproc://, plus a control protocol: hello,
// assignment, ready, heartbeats both ways, finish and the stages' final reports, and a worker's
// request to stop the run (it got SIGTERM: the coordinator checkpoints and stops, as on its own).

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/config/job_data.h"
#include "actors/engine/run_reports.h"
#include "actors/hosts/pipeline_host.h"
#include "transport/curve_keys.h"

namespace troupe::actors {

/// Heartbeat timing of both ends.
struct liveness_settings {
  double heartbeat_s = 0.5;  ///< each end sends a heartbeat this often
  double timeout_s = 10.0;   ///< a peer silent this long is dead
  double startup_s = 60.0;   ///< how long to wait for workers to join and get ready
};

struct worker_options {
  std::string coordinator_address;  ///< e.g. "tcp://10.0.0.1:29500" or "ipc:///tmp/troupe-1/c"
  std::string listen_address;       ///< where this worker receives, e.g. "tcp://10.0.0.2:*"
  liveness_settings liveness;
  /// CURVE keys and policy of this process (plain by default: loopback addresses only).
  transport::security_settings security;
  /// With CURVE: the coordinator's public key.
  std::string coordinator_key;
  /// checkpoint_config_hash() of the job this worker was started for (launchers, where every
  /// rank reads the job file); the coordinator refuses a worker of another job. Empty: any.
  std::string job_hash;
  /// The run's secret, which the hello presents (coordinator_options::run_secret).
  std::string run_secret;
  /// Set (by a SIGTERM handler) when this worker should ask its coordinator for a checkpoint
  /// and a clean stop of the run; the worker sends the request once and serves on until the
  /// coordinator finishes the job. Null: never.
  std::atomic<bool>* stop_requests = nullptr;
};

/// A worker's whole life: joins the coordinator, builds the stages it is assigned, serves them
/// until told to finish (or the coordinator goes silent). Returns a process exit status; on
/// failure `error` says why, naming the peer.
int run_worker(const worker_options& options, clock_source& clock, std::string* error);

/// A worker process of this machine that has ended, and how ("was killed by signal 9
/// (Killed)", "exited with status 1").
struct exited_worker {
  int64_t pid = 0;
  std::string how;
};

struct coordinator_options {
  std::string listen_address;  ///< where the coordinator receives
  int workers = 1;
  std::string job_toml;  ///< the job file's text and overrides, shipped to the workers
  std::vector<std::string> overrides;
  /// The config hash a worker started for this job presents (empty: the run config's
  /// checkpoint_config_hash); the job file's own when the run chose its partition's cut points.
  std::string job_hash;
  liveness_settings liveness;
  /// Checkpoints, resume, initial weights and signal requests as in one process.
  pipeline_options pipeline;
  /// Starts a replacement for a lost worker (local workers); empty: wait for the lost rank to
  /// rejoin by itself (cluster launchers) for up to checkpoint.rejoin_timeout_s.
  std::function<bool(std::string* error)> replace_worker;
  /// The worker processes started on this machine (local workers) that have ended since the
  /// last call; the coordinator polls it between heartbeats and loses such a worker at once
  /// instead of after liveness.timeout_s. Empty: only heartbeats tell (cluster launchers).
  std::function<std::vector<exited_worker>()> exited_workers;
  /// CURVE keys and policy of this process; workers must hold a key on its allow-list.
  transport::security_settings security;
  /// A secret that every worker's hello must present, or the hello is ignored without an
  /// answer (`troupe train --workers` makes one per run and hands it to its workers as
  /// TROUPE_RUN_SECRET; other launches read that variable). Together with job ids no one can
  /// guess, it keeps a local process that is not one of the run's from joining it or injecting
  /// messages where CURVE is off. Empty: any hello is heard.
  std::string run_secret;
};

/// Waits for `options.workers` workers, ships the job, trains, collects the stages' reports.
/// When a worker dies, the pipeline is reset, a replacement joins (started by
/// options.replace_worker or rejoining by itself), every stage reloads the latest checkpoint
/// and the run goes on, at most checkpoint.max_restarts times. Returns nothing with `error`
/// naming the worker (stage, host, pid) when one dies past that or never answers.
std::optional<pipeline_report> run_coordinator(const job_config& config, const job_data& data,
                                               const coordinator_options& options,
                                               training_observer& observer, clock_source& clock,
                                               std::string* error);

}  // namespace troupe::actors
