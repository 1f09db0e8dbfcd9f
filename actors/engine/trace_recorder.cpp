#include "actors/engine/trace_recorder.h"

#include <algorithm>
#include <cmath>

namespace troupe::actors {
namespace {

constexpr double microseconds = 1e6;

/// Chrome's thread id of a track: the coordinator gets 0, stage s gets s + 1.
int thread_of(int track) { return track + 1; }

nlohmann::json complete_event(const std::string& name, const char* category, int track,
                              double start_s, double duration_s) {
  return {{"name", name},
          {"cat", category},
          {"ph", "X"},
          {"pid", 0},
          {"tid", thread_of(track)},
          {"ts", start_s * microseconds},
          {"dur", duration_s * microseconds}};
}

/// Names of spans are short words ("forward", "backward+step"): anything longer is not one.
constexpr size_t max_span_name = 32;

bool finite_number(const nlohmann::json& value) {
  return value.is_number() && std::isfinite(value.get<double>());
}

}  // namespace

trace_recorder::trace_recorder(int stages, size_t capacity)
    : stages_(stages), capacity_(capacity) {}

void trace_recorder::span(int track, const std::string& name, int64_t key, double start_s,
                          double duration_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (make_room()) spans_.push_back({track, name, key, start_s, duration_s});
}

void trace_recorder::flow(int from_track, int to_track, int64_t key, double sent_s,
                          double received_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (make_room()) flows_.push_back({from_track, to_track, key, sent_s, received_s});
}

uint64_t trace_recorder::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

nlohmann::json trace_recorder::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json spans = nlohmann::json::array(), flows = nlohmann::json::array();
  for (const span_record& s : spans_) {
    spans.push_back({s.track, s.name, s.key, s.start_s, s.duration_s});
  }
  for (const flow_record& f : flows_) {
    flows.push_back({f.from_track, f.to_track, f.key, f.sent_s, f.received_s});
  }
  return {{"spans", spans}, {"flows", flows}, {"dropped", dropped_}};
}

bool trace_recorder::add_records(const nlohmann::json& records,
                                 const std::vector<double>& track_offsets_s, std::string* error) {
  if (track_offsets_s.size() != static_cast<size_t>(stages_) + 1) {
    *error = "clock offsets for " + std::to_string(track_offsets_s.size()) +
             " tracks; the trace has " + std::to_string(stages_ + 1);
    return false;
  }
  const auto offset = [&](const nlohmann::json& track) {
    return track_offsets_s[static_cast<size_t>(track.get<int>() + 1)];
  };
  const auto track_ok = [&](const nlohmann::json& value) {
    return value.is_number_integer() && value.get<int64_t>() >= -1 &&
           value.get<int64_t>() < stages_;
  };
  if (!records.is_object() || !records.contains("spans") || !records["spans"].is_array() ||
      !records.contains("flows") || !records["flows"].is_array()) {
    *error = "not an object with \"spans\" and \"flows\" lists";
    return false;
  }
  const nlohmann::json& spans = records["spans"];
  const nlohmann::json& flows = records["flows"];
  const nlohmann::json dropped = records.value("dropped", nlohmann::json(0));
  if (!dropped.is_number_integer() || dropped.get<int64_t>() < 0) {
    *error = "\"dropped\" is not a count";
    return false;
  }
  for (size_t i = 0; i < spans.size(); ++i) {
    const nlohmann::json& s = spans[i];
    if (!s.is_array() || s.size() != 5 || !track_ok(s[0]) || !s[1].is_string() ||
        s[1].get_ref<const std::string&>().size() > max_span_name || !s[2].is_number_integer() ||
        !finite_number(s[3]) || !finite_number(s[4]) || s[4].get<double>() < 0) {
      *error = "span " + std::to_string(i) + " is not [track, name, key, start_s, duration_s]";
      return false;
    }
  }
  for (size_t i = 0; i < flows.size(); ++i) {
    const nlohmann::json& f = flows[i];
    if (!f.is_array() || f.size() != 5 || !track_ok(f[0]) || !track_ok(f[1]) ||
        !f[2].is_number_integer() || !finite_number(f[3]) || !finite_number(f[4])) {
      *error = "flow " + std::to_string(i) + " is not [from, to, key, sent_s, received_s]";
      return false;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  dropped_ += dropped.get<uint64_t>();
  for (const nlohmann::json& s : spans) {
    if (!make_room()) continue;
    spans_.push_back({s[0].get<int>(), s[1].get<std::string>(), s[2].get<int64_t>(),
                      s[3].get<double>() + offset(s[0]), s[4].get<double>()});
  }
  for (const nlohmann::json& f : flows) {
    if (!make_room()) continue;
    flows_.push_back({f[0].get<int>(), f[1].get<int>(), f[2].get<int64_t>(),
                      f[3].get<double>() + offset(f[0]), f[4].get<double>() + offset(f[1])});
  }
  return true;
}

void trace_recorder::add_track_names(nlohmann::json* events) const {
  for (int track = -1; track < stages_; ++track) {
    const std::string name = track < 0 ? "coordinator" : "stage " + std::to_string(track);
    events->push_back({{"name", "thread_name"},
                       {"ph", "M"},
                       {"pid", 0},
                       {"tid", thread_of(track)},
                       {"args", {{"name", name}}}});
    events->push_back({{"name", "thread_sort_index"},
                       {"ph", "M"},
                       {"pid", 0},
                       {"tid", thread_of(track)},
                       {"args", {{"sort_index", thread_of(track)}}}});
  }
}

void trace_recorder::add_spans(nlohmann::json* events) const {
  std::vector<span_record> sorted = spans_;
  std::sort(sorted.begin(), sorted.end(), [](const span_record& a, const span_record& b) {
    return a.track != b.track ? a.track < b.track : a.start_s < b.start_s;
  });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const span_record& s = sorted[i];
    nlohmann::json event = complete_event(s.name, "work", s.track, s.start_s, s.duration_s);
    if (s.key >= 0) event["args"] = {{"key", s.key}};
    events->push_back(event);
    // The gap up to the same track's next span is idle time (the pipeline's bubble).
    if (i + 1 < sorted.size() && sorted[i + 1].track == s.track && s.track >= 0) {
      const double end = s.start_s + s.duration_s;
      if (sorted[i + 1].start_s > end) {
        events->push_back(
            complete_event("idle", "idle", s.track, end, sorted[i + 1].start_s - end));
      }
    }
  }
}

void trace_recorder::add_flows(nlohmann::json* events) const {
  uint64_t id = 0;
  for (const flow_record& f : flows_) {
    ++id;
    const nlohmann::json args = {{"key", f.key}};
    events->push_back({{"name", "message"},
                       {"cat", "message"},
                       {"ph", "s"},
                       {"id", id},
                       {"pid", 0},
                       {"tid", thread_of(f.from_track)},
                       {"ts", f.sent_s * microseconds},
                       {"args", args}});
    events->push_back({{"name", "message"},
                       {"cat", "message"},
                       {"ph", "f"},
                       {"bp", "e"},
                       {"id", id},
                       {"pid", 0},
                       {"tid", thread_of(f.to_track)},
                       {"ts", f.received_s * microseconds},
                       {"args", args}});
  }
}

nlohmann::json trace_recorder::to_json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json events = nlohmann::json::array();
  add_track_names(&events);
  add_spans(&events);
  add_flows(&events);
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"dropped_records", dropped_}}}};
}

}  // namespace troupe::actors
