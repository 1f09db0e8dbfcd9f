#pragma once

// The simulated host: the coordinator's training_run and every stage's stage_logic — the very
// state machines a real run uses — driven by a discrete-event loop in virtual time. Device
// work is charged by the cost model (each device runs one piece of work at a time, in arrival
// order), messages cross the cluster's links as flows of the network model, and in numerics
// mode the math really runs on the CPU so that loss and accuracy come out against simulated
// time. Events are ordered by (virtual time, sequence number) and every random draw comes from
// one seeded source, so a seed replays the same run to the same trace hash.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/config/job_data.h"
#include "actors/engine/run_reports.h"
#include "actors/engine/trace_recorder.h"
#include "sim/cluster_model.h"
#include "sim/profile.h"

namespace troupe::sim {

/// A device whose work is sometimes slower: each piece of work is stretched by `slowdown`
/// with probability `probability` (1: always, a slow node).
struct straggler {
  int device = 0;
  double probability = 1;
  double slowdown = 2;
};

/// A link whose bandwidth is multiplied by `factor` during [start_s, end_s).
struct link_degradation {
  int link = 0;
  double start_s = 0;
  double end_s = 0;
  double factor = 0.5;
};

/// The worker process hosting `device` dies at `at_s` of virtual time: the state of every
/// stage and every key in flight is lost. What follows is the coordinator's recovery: the
/// death is noticed after simulation_options::detection_s, a replacement joins restart_s
/// later and reads the latest checkpoint, every stage loads it (the initial weights when there
/// is none), and a new training_run continues from its step; after checkpoint.max_restarts
/// recoveries the next failure ends the run with an error naming the device.
struct worker_failure {
  int device = 0;
  double at_s = 0;
};

struct simulation_options {
  /// Run the math on the CPU (loss and accuracy are real); otherwise shapes only.
  bool numerics = false;
  uint64_t seed = 1;
  std::vector<straggler> stragglers;
  std::vector<link_degradation> degradations;
  /// Bytes of a message's header frame (added to its payload on the wire).
  double header_bytes = 256;
  /// Measured block costs (`troupe calibrate`) instead of the roofline model.
  std::optional<machine_profile> profile;
  /// CPU seconds a stage's device spends on each message it receives or sends (the profile's
  /// inproc_message_cpu_s or ipc_message_cpu_s); 0: messages cost only link time.
  double message_cpu_s = 0;
  /// CPU seconds per payload byte of each such message on top of message_cpu_s (the profile's
  /// inproc_message_cpu_per_byte_s or ipc_message_cpu_per_byte_s).
  double message_cpu_per_byte_s = 0;
  std::vector<worker_failure> failures;
  /// From a worker's death to the coordinator noticing it (its heartbeat timeout).
  double detection_s = 10;
  /// From noticing a death to the replacement worker having joined.
  double restart_s = 2;
  /// Most work spans kept for trace.json (0: none); a longer run keeps the first ones.
  size_t trace_spans = 30000;
};

struct simulation_result {
  actors::training_summary summary;  ///< in virtual time
  double virtual_s = 0;              ///< the simulated run's length
  std::vector<double> stage_utilization;
  std::vector<double> stage_idle_fraction;
  std::vector<std::string> link_names;  ///< links that carried traffic
  std::vector<double> link_utilization;
  /// Backward passes by staleness, all stages together.
  std::vector<int64_t> staleness_histogram;
  /// The same per stage actor (as a real run's summary.json gives it), to compare stage by stage.
  std::vector<std::vector<int64_t>> stage_staleness_histograms;
  std::vector<std::string> device_names;  ///< devices that host stages
  std::vector<double> device_peak_bytes;
  std::vector<double> device_memory_bytes;
  int64_t checkpoints = 0;  ///< written
  /// Virtual seconds spent writing checkpoints (the pipeline is drained meanwhile).
  double checkpoint_s = 0;
  int64_t restarts = 0;
  /// Virtual seconds from each failure to the restarted pipeline's first key, summed.
  double recovery_s = 0;
  /// Optimizer steps trained and then lost to failures (redone after a restart).
  int64_t lost_steps = 0;
  int64_t events = 0;
  /// The simulation's own speed, measured by its caller (the simulator reads no clock).
  double wall_s = 0;
  double events_per_s = 0;
  uint64_t trace_hash = 0;
  std::unique_ptr<actors::trace_recorder> trace;
};

/// Simulates `config` (trained on `data`) on `cluster`. Nothing, with `error` set, when the
/// job does not fit the cluster (a placement naming a missing device) or the run fails (the
/// loss diverged in numerics mode).
std::optional<simulation_result> simulate(const actors::job_config& config,
                                          const actors::job_data& data,
                                          const cluster_model& cluster,
                                          const simulation_options& options,
                                          actors::training_observer& observer, std::string* error);

}  // namespace troupe::sim
