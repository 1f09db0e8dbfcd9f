#pragma once

// A run's timeline in Chrome's trace format (opens in Perfetto and chrome://tracing): one
// track per stage with forward, backward and optimizer-step spans, idle spans filling the gaps,
// and flow arrows for the messages between stages — the Gantt chart of the pipelining papers.
// Times are given by the caller (seconds from the run's start), so the recorder reads no clock.

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::actors {

class trace_recorder {
 public:
  /// Spans and message arrows one trace keeps: about 55k steps of a 4-stage pipeline, or a
  /// trace.json of some 200 MB. Later ones are counted and left out, so a long run with
  /// tracing on keeps its memory bounded.
  static constexpr size_t default_capacity = 1'000'000;

  /// Track -1 is the coordinator; tracks 0.. are stages.
  explicit trace_recorder(int stages, size_t capacity = default_capacity);

  /// A span of work on `track` (name: "forward", "backward", "step", "evaluate"); `key` is -1
  /// for spans that belong to no key. Safe to call from any thread.
  void span(int track, const std::string& name, int64_t key, double start_s, double duration_s);
  /// A message leaving `from_track` at `sent_s` for `to_track`, arriving at `received_s`.
  void flow(int from_track, int to_track, int64_t key, double sent_s, double received_s);

  /// The recorded spans and flows as they are, for another process's recorder to add:
  /// {"spans": [[track, name, key, start_s, duration_s], ...],
  ///  "flows": [[from_track, to_track, key, sent_s, received_s], ...], "dropped": N}.
  nlohmann::json records() const;
  /// Adds records() of another recorder (a worker's). Its times are on the clocks of the
  /// processes that took them: `track_offsets_s[track + 1]` is added to a time taken on
  /// `track` (a message arrow's start on its sender's track), one entry per track. Checks all of
  /// them first (tracks within this trace's stages, finite times, durations not negative, names of
  /// at most 32 characters): on a bad one nothing is added and `error` names it. Records over
  /// this trace's capacity are counted as dropped, with those the other recorder dropped.
  bool add_records(const nlohmann::json& records, const std::vector<double>& track_offsets_s,
                   std::string* error);

  /// Spans and arrows left out for want of capacity (here and in the recorders added).
  uint64_t dropped() const;
  size_t capacity() const { return capacity_; }

  /// The trace as Chrome trace JSON, with idle spans between each track's work spans, and
  /// "otherData": {"dropped_records": dropped()}.
  nlohmann::json to_json() const;

 private:
  struct span_record {
    int track;
    std::string name;
    int64_t key;
    double start_s;
    double duration_s;
  };
  struct flow_record {
    int from_track;
    int to_track;
    int64_t key;
    double sent_s;
    double received_s;
  };

  void add_track_names(nlohmann::json* events) const;
  void add_spans(nlohmann::json* events) const;
  void add_flows(nlohmann::json* events) const;

  /// True when one more record fits; otherwise counts it as dropped. Called under mutex_.
  bool make_room() {
    if (spans_.size() + flows_.size() < capacity_) return true;
    ++dropped_;
    return false;
  }

  int stages_;
  size_t capacity_;
  mutable std::mutex mutex_;
  uint64_t dropped_ = 0;
  std::vector<span_record> spans_;
  std::vector<flow_record> flows_;
};

}  // namespace troupe::actors
