#pragma once

// What a run looks like from outside while it runs, for the dashboard and the stall watch: the
// lines of metrics.jsonl, each stage actor's latest activity (the keys it holds, its mailbox,
// the last message it took and sent), the recent spans of stage work, the workers. Hosts write
// to it from any thread; readers take JSON snapshots. Times are passed in, on the clock of the
// process that owns the monitor, and shown relative to `origin_s`.

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::actors {

/// One message a stage took or sent.
struct message_note {
  std::string kind;  ///< the wire kind ("forward", "backward", "evaluate", ...); empty: none yet
  int64_t key = -1;
  int peer = -1;  ///< the other end's stage actor; -1: the coordinator
  double at_s = 0;
};

/// A stage actor's state after its latest message.
struct stage_activity {
  int64_t version = 0;
  std::vector<int64_t> keys_held;     ///< forward pass run, backward pass not yet
  std::vector<int64_t> keys_waiting;  ///< messages held back (1F1B's bound, a replica sum)
  int64_t mailbox = 0;                ///< messages queued for its actor
  message_note last_received;
  message_note last_sent;
  std::vector<int64_t> staleness_histogram;
  /// The stage is in the middle of taking last_received (its handler has not returned).
  bool working = false;
};

/// As /api/stages and heartbeats carry it: times as ages before `now_s`.
nlohmann::json to_json(const stage_activity& activity, double now_s);
/// The activity in `json` (a peer's heartbeat), ages taken back to times before `now_s`.
/// Nothing, with `error` naming the field, when a field has the wrong type.
std::optional<stage_activity> stage_activity_from_json(const nlohmann::json& json, double now_s,
                                                       std::string* error);

/// A process hosting stages (a worker, or the run's own process).
struct hosting_process {
  std::string name;  ///< "worker 2", "this process"
  std::string host;
  int64_t pid = 0;
  std::vector<int> stages;  ///< stage actors
  /// Its last heartbeat; none for the process that holds the monitor (always heard).
  std::optional<double> last_heard_s;
};

class run_monitor {
 public:
  /// Spans of stage work kept for the Gantt chart and utilization, newest last.
  static constexpr size_t default_span_capacity = 50'000;
  /// How far back utilization and idle look.
  static constexpr double utilization_window_s = 10;

  /// `info`: the run's fixed facts for /api/summary (job, mode, stages, replicas, schedule,
  /// total_steps, epochs, source). `stage_actors`: replicas × stages.
  run_monitor(nlohmann::json info, int stage_actors, double origin_s,
              size_t span_capacity = default_span_capacity);
  run_monitor(const run_monitor&) = delete;
  run_monitor& operator=(const run_monitor&) = delete;

  int stage_actors() const { return static_cast<int>(activity_.size()); }
  double origin_s() const { return origin_s_; }

  // Written by the run ---------------------------------------------------------------------
  /// A line of metrics.jsonl (a record, or an event with an "event" field).
  void add_record(const nlohmann::json& line);
  /// Progress after a step, for the summary (as the progress bar sees it).
  void note_step(int64_t step, int64_t total_steps, int64_t epoch, double samples_per_s);
  /// A stage actor took `note` (at the start of its handler: a stage stuck in it shows what).
  void note_received(int actor, const message_note& note);
  /// A stage actor's state after handling a message (copied into buffers kept from the last).
  void set_activity(int actor, const stage_activity& activity);
  /// A span of work on `track` (-1: the coordinator), at clock times. `name` is one of the
  /// engine's span names (trace_recorder's); any other is kept as "other".
  void add_span(int track, const char* name, int64_t key, double start_s, double duration_s);
  /// The coordinator heard from a stage; `keys_in_flight` after handling it.
  void note_coordinator(double now_s, int64_t keys_in_flight);
  /// The processes hosting the stages, and the restarts after lost workers.
  void set_processes(std::vector<hosting_process> processes, int restarts);
  /// The run has ended; `summary` is summary.json.
  void set_finished(nlohmann::json summary);

  // Between processes ----------------------------------------------------------------------
  /// Spans one heartbeat carries at most (the newest): control messages are small.
  static constexpr size_t heartbeat_spans = 256;
  /// What a worker's heartbeat carries of `actors` (the stage actors it hosts): their
  /// activity, and the newest heartbeat_spans spans that ended after `since_s`, times as ages
  /// before `now_s`:
  /// {"activity": [{"actor": N, ...}], "spans": [[track, name, key, start_age_s, duration_s]]}.
  nlohmann::json heartbeat_json(const std::vector<int>& actors, double since_s, double now_s) const;
  /// Takes in a heartbeat_json() of a worker hosting `actors`, arrived at `now_s`. False, with
  /// `error` saying why, when it is malformed or speaks of a stage actor not in `actors`;
  /// nothing is taken then.
  bool add_heartbeat(const nlohmann::json& heartbeat, const std::vector<int>& actors, double now_s,
                     std::string* error);

  // The stall watch ------------------------------------------------------------------------
  /// Whether keys are in flight and the coordinator heard nothing for `timeout_s` (> 0) by
  /// `now_s`. True once per stall: it stays quiet until the coordinator hears again.
  bool stall_began(double now_s, double timeout_s);
  /// The report of where every stage stands: `event` is "stall" or "status". Kept as the
  /// dashboard's banner while stalled.
  nlohmann::json status_report(const std::string& event, double now_s);

  // Read by the dashboard ------------------------------------------------------------------
  nlohmann::json summary_json(double now_s) const;
  /// {"next": N, "records": [lines since `since`]}.
  nlohmann::json metrics_json(size_t since) const;
  nlohmann::json stages_json(double now_s) const;
  /// Spans that ended after `since_s` (run seconds), within the last `window_s`.
  nlohmann::json trace_json(double since_s, double now_s, double window_s = 10) const;

 private:
  struct span_record {
    int track;
    const char* name;  ///< interned: one of the engine's span names
    int64_t key;
    double start_s;
    double duration_s;
  };
  using span_iterator = std::deque<span_record>::const_iterator;
  /// Where the views of the run end: now, or a finished run's last span. Under mutex_.
  double view_end(double now_s) const;
  /// The first span that may end after `from_s`: spans end roughly in order, so the walk back
  /// from the newest stops a little before it. Under mutex_.
  span_iterator first_span_after(double from_s) const;
  /// Share of [now − window, now] that `actor` spent in spans. Under mutex_.
  double busy_share(int actor, double now_s, double window_s) const;
  const hosting_process* process_of(int actor) const;
  /// Seconds since the last heartbeat of the process hosting `process` (0: none needed).
  static double heartbeat_age(const hosting_process& process, double now_s);
  /// A stage actor's activity as the endpoints show it, with its worker and host (`nobody`
  /// where no process is known to host it). Under mutex_.
  nlohmann::json stage_entry(int actor, double now_s, const char* nobody) const;

  const nlohmann::json info_;
  const double origin_s_;
  const size_t span_capacity_;
  mutable std::mutex mutex_;
  std::vector<nlohmann::json> records_;
  std::vector<stage_activity> activity_;
  std::vector<double> busy_s_;
  std::deque<span_record> spans_;
  std::vector<hosting_process> processes_;
  int restarts_ = 0;
  int64_t step_ = 0, total_steps_ = 0, epoch_ = 0;
  double samples_per_s_ = 0;
  double last_heard_s_ = -1;  ///< the coordinator's last report from a stage; -1: none yet
  int64_t keys_in_flight_ = 0;
  bool stall_reported_ = false;
  nlohmann::json stall_;  ///< the report while stalled, else null
  nlohmann::json summary_;
  bool finished_ = false;
};

/// The report as lines for a log: one per stage actor.
std::string describe_status(const nlohmann::json& report);

}  // namespace troupe::actors
