#pragma once

// `troupe train --workers N`: worker processes of this same binary on this machine, started
// before the run and cleaned up after it, on errors and on Ctrl-C alike (see run_signals.h).

#include <sys/types.h>
#include <string>
#include <vector>

#include "actors/cluster/cluster_host.h"

namespace troupe::apps {

/// The environment variable that hands a run's secret to its workers.
inline constexpr const char* run_secret_variable = "TROUPE_RUN_SECRET";

/// 128 random bits as 32 hex digits.
std::string fresh_run_secret();
/// TROUPE_RUN_SECRET's value; empty when it is not set.
std::string run_secret_from_environment();

class local_workers {
 public:
  /// A private directory for the ipc:// endpoints of one run (removed by the destructor).
  local_workers();
  ~local_workers();
  local_workers(const local_workers&) = delete;
  local_workers& operator=(const local_workers&) = delete;

  /// The coordinator's address for this run.
  std::string coordinator_address() const { return "ipc://" + directory_ + "/coordinator"; }
  /// The run's secret (coordinator_options::run_secret): 128 random bits, which each worker
  /// gets in its environment as TROUPE_RUN_SECRET.
  const std::string& run_secret() const { return secret_; }
  /// Starts `count` `troupe worker` processes that join coordinator_address(); false with
  /// `error` set when one cannot be started.
  bool start(int count, std::string* error);
  /// Starts one more worker (replacing a lost one); reaps the workers that have exited.
  bool start_replacement(std::string* error);
  /// The workers that have ended since the last call (reaped), and how.
  std::vector<actors::exited_worker> collect_exited();
  /// Kills every running worker of this process (async-signal-safe): SIGKILL, since a worker
  /// takes SIGTERM as a request to stop the run cleanly, which it passes to its coordinator.
  static void terminate_all();
  /// Waits for the workers to exit (they do after the run's finish message); kills any still
  /// running after `grace_s` seconds.
  void reap(double grace_s);

 private:
  bool spawn_worker(std::string* error);
  void reap_exited();

  std::string directory_;
  std::string secret_;
  std::vector<pid_t> children_;
  std::vector<actors::exited_worker> exited_;  ///< reaped, not yet collected
  int started_ = 0;
};

}  // namespace troupe::apps
