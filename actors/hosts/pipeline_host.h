#pragma once

// The real host of a pipelined run in one process: one C++ Actor Framework actor per stage and
// one for the coordinator, the stage and coordinator state machines inside them, and ZeroMQ
// inproc:// sockets between them (the same frames that ipc:// and tcp:// will carry). No CAF
// or ZeroMQ type appears in this header.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/config/job_data.h"
#include "actors/engine/run_monitor.h"
#include "actors/engine/run_reports.h"
#include "actors/engine/trace_recorder.h"
#include "actors/storage/checkpoint_store.h"

namespace troupe::actors {

struct pipeline_options {
  /// Copy every stage's final weights into the report (for tests and exports).
  bool collect_weights = false;
  /// Record the timeline here when not null.
  trace_recorder* trace = nullptr;
  /// Where checkpoints go (empty: nowhere; the run takes none).
  std::string checkpoint_directory;
  std::string job_name;  ///< recorded in each manifest
  /// Continue from this checkpoint (its stages' shards and the coordinator's progress).
  std::optional<loaded_checkpoint> resume;
  /// Initial weights, one shard per stage loaded weights-only (model.init_from).
  std::vector<std::shared_ptr<const std::string>> initial_weights;
  /// Polled while training: 1 asks for a checkpoint, 2 for a checkpoint and then a stop
  /// (SIGUSR1, SIGTERM); set back to 0 when passed on.
  std::atomic<int>* checkpoint_requests = nullptr;
  /// Where the run shows what it does (the dashboard, stall reports); null: nowhere.
  run_monitor* monitor = nullptr;
  /// Polled while training: true asks for a status report (SIGUSR2); set back when taken.
  std::atomic<bool>* status_requests = nullptr;
};

/// What the stages report at the end of a run.
struct stage_report {
  std::vector<int64_t> staleness_histogram;
  std::vector<int64_t> weight_staleness_histogram;
  /// Async replicas: steps by versions ahead of the slowest replica (an upper bound).
  std::vector<int64_t> replica_staleness_histogram;
  size_t peak_contexts = 0;
  int64_t peak_activation_bytes = 0;  ///< see stage_device::peak_activation_bytes
  int64_t version = 0;
  std::vector<std::vector<float>> weights;
};

/// The operating system's account of one process of a run, from its start to the run's end.
struct process_usage {
  std::string role;  ///< "process" (the whole run in one), "coordinator" or "worker"
  std::string host;
  int64_t pid = 0;
  std::vector<int> stages;           ///< the stages it hosted
  double user_s = 0;                 ///< CPU time in user mode
  double system_s = 0;               ///< CPU time in the kernel (system calls, wake-ups, copies)
  int64_t voluntary_switches = 0;    ///< times it waited (for a message, a lock)
  int64_t involuntary_switches = 0;  ///< times another thread took its core
};

/// This machine's host name ("unknown-host" when it has none).
std::string host_name();

/// This process's usage so far (getrusage), as `role` hosting `stages`.
process_usage this_process_usage(const std::string& role, std::vector<int> stages);

/// As summary.json's `processes` entries and a worker's usage message carry it.
nlohmann::json to_json(const process_usage& usage);
/// The usage in `json` (a peer's message): fields missing or of another type read as empty/0.
process_usage process_usage_from_json(const nlohmann::json& json);

struct pipeline_report {
  training_summary summary;
  std::vector<stage_report> stages;
  /// One per process of the run: this one alone, or the coordinator and then each worker.
  std::vector<process_usage> processes;
  /// Frames the receivers dropped as undecodable (0 in a healthy run).
  uint64_t dropped_frames = 0;
  /// Control messages the coordinator dropped: malformed, or from a peer that is not one of
  /// its workers (cluster runs; its workers' count is in dropped_frames).
  uint64_t dropped_control_messages = 0;
  /// The run stopped early after a checkpoint (a stop request).
  bool stopped = false;
};

/// Trains `config`'s model on `data` with its [parallelism] settings. The observer is called
/// from the coordinator actor's thread; `clock` must be safe to read from several threads.
/// Returns nothing with `error` set when the job cannot be set up (bad partition or device).
std::optional<pipeline_report> run_pipeline(const job_config& config, const job_data& data,
                                            training_observer& observer, clock_source& clock,
                                            const pipeline_options& options, std::string* error);

}  // namespace troupe::actors
