#pragma once

// What the cluster coordinator knows of its workers: who they are, when it last heard from
// them, the clock stamps they echo, and which of them has ended.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/cluster/cluster_host.h"
#include "actors/engine/run_monitor.h"
#include "transport/endpoint.h"

namespace troupe::actors {

/// A worker as the coordinator knows it.
struct worker_peer {
  std::string address;
  std::string host;
  int64_t pid = 0;
  std::string public_key;  ///< with CURVE: what its inbox proves to hold
  std::optional<transport::outbox> control;
  std::vector<int> stages;
  double last_heard = 0;
  /// Its last stamped message (hello or heartbeat): its clock as it sent it and this one's as it
  /// arrived. Assignments and heartbeats echo them, with this clock as they leave, so that the
  /// worker can tell its clock's offset from this one (for the trace).
  nlohmann::json echo;

  /// "worker pid 42 on node3 (stages 0,1)".
  std::string describe() const;
};

/// The worker that a hello announces, before the coordinator checks it: its address, host,
/// pid, public key and clock stamps.
worker_peer peer_from_hello(const nlohmann::json& body);

/// The clock stamps of a control message (its sender's clock as it left, this one's as it
/// arrived); null when it carries none.
nlohmann::json clock_stamps(const nlohmann::json& body);

/// `body` with the echo of `worker`'s last stamps and `now` (this clock) as it leaves.
nlohmann::json with_stamps(nlohmann::json body, const worker_peer& worker, double now);

/// The worker whose address is `address`, or null for a peer that is not one of them.
worker_peer* find_worker(std::vector<worker_peer>& workers, const std::string& address);

/// A worker whose process has ended (from `ended`, the processes reported ended and not dealt
/// with yet: local workers only, at once) or that has been silent longer than `timeout_s`, with
/// `reason` saying which ("was killed by signal 9 (Killed)", "stopped responding 10 s ago").
/// Two workers may end at once: the second stays in `ended` until the first is dealt with;
/// processes that are no worker of the run (any more) are dropped from it.
std::optional<size_t> ended_worker(const std::vector<worker_peer>& workers,
                                   std::vector<exited_worker>* ended, double now, double timeout_s,
                                   std::string* reason);

/// The workers as the run's monitor shows them.
std::vector<hosting_process> hosting_processes(const std::vector<worker_peer>& workers);

}  // namespace troupe::actors
