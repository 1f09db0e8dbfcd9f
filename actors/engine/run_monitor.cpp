#include "actors/engine/run_monitor.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace troupe::actors {

using json = nlohmann::json;

namespace {

json to_json(const message_note& note, double now_s) {
  if (note.kind.empty()) return nullptr;
  return {
      {"kind", note.kind}, {"key", note.key}, {"peer", note.peer}, {"age_s", now_s - note.at_s}};
}

bool integers_from(const json& value, std::vector<int64_t>* out) {
  if (!value.is_array()) return false;
  out->clear();
  for (const json& item : value) {
    if (!item.is_number_integer()) return false;
    out->push_back(item.get<int64_t>());
  }
  return true;
}

bool note_from(const json& value, double now_s, message_note* out) {
  if (value.is_null()) return true;
  if (!value.is_object() || !value.value("kind", json()).is_string() ||
      !value.value("key", json()).is_number_integer() ||
      !value.value("peer", json()).is_number_integer() ||
      !value.value("age_s", json()).is_number()) {
    return false;
  }
  out->kind = value["kind"].get<std::string>().substr(0, 32);
  out->key = value["key"].get<int64_t>();
  out->peer = value["peer"].get<int>();
  out->at_s = now_s - value["age_s"].get<double>();
  return true;
}

std::string describe_note(const json& note) {
  if (!note.is_object()) return "nothing";
  char text[160];
  const int peer = note.value("peer", -1);
  std::snprintf(text, sizeof text, "%s key %lld %s %s %.1f s ago",
                note.value("kind", std::string()).c_str(),
                static_cast<long long>(note.value("key", int64_t{-1})),
                note.value("direction", std::string("with")).c_str(),
                peer < 0 ? "the coordinator" : ("stage " + std::to_string(peer)).c_str(),
                note.value("age_s", 0.0));
  return text;
}

std::string list_of(const json& keys) {
  if (!keys.is_array() || keys.empty()) return "none";
  std::string text;
  for (const json& key : keys) text += (text.empty() ? "" : " ") + key.dump();
  return text;
}

/// The span names the hosts record; a span of another name is kept as "other".
const char* interned_span_name(const char* name) {
  static const char* const names[] = {
      "forward",          "backward",      "step",       "evaluate",
      "forward+backward", "backward+step", "scheduled",  "forward+backward+step",
      "scheduled+step",   "reduce",        "reduce+step"};
  for (const char* known : names)
    if (std::strcmp(known, name) == 0) return known;
  return "other";
}

/// How far out of order (by their ends) spans of different stages may arrive: first_span_after
/// walks back this far past where it is asked to stop.
constexpr double span_order_slack_s = 2;

/// The checkpoint events among `records`, as /api/summary lists them: step, the run time it
/// was taken at (wall_s, or a simulation's virtual_s), and where it is, its size and how long it
/// took to write when the event says. A field the event lacks is left out, not made 0.
json checkpoints_of(const std::vector<json>& records) {
  json checkpoints = json::array();
  for (const json& line : records) {
    if (line.value("event", std::string()) != "checkpoint") continue;
    json entry = {{"step", line.value("step", int64_t{0})}};
    for (const char* field : {"wall_s", "virtual_s", "bytes", "seconds"}) {
      if (line.contains(field) && line[field].is_number()) entry[field] = line[field];
    }
    if (line.contains("directory") && line["directory"].is_string())
      entry["path"] = line["directory"];
    checkpoints.push_back(std::move(entry));
  }
  return checkpoints;
}

}  // namespace

json to_json(const stage_activity& activity, double now_s) {
  return {{"version", activity.version},
          {"working_on", activity.working ? to_json(activity.last_received, now_s) : json()},
          {"keys_held", activity.keys_held},
          {"keys_waiting", activity.keys_waiting},
          {"mailbox", activity.mailbox},
          {"last_received", to_json(activity.last_received, now_s)},
          {"last_sent", to_json(activity.last_sent, now_s)},
          {"staleness_histogram", activity.staleness_histogram}};
}

std::optional<stage_activity> stage_activity_from_json(const json& value, double now_s,
                                                       std::string* error) {
  stage_activity activity;
  const auto bad = [&](const char* field) {
    *error = std::string("activity field \"") + field + "\" is missing or of the wrong type";
    return std::nullopt;
  };
  if (!value.is_object()) {
    *error = "activity is not an object";
    return std::nullopt;
  }
  if (!value.value("version", json()).is_number_integer()) return bad("version");
  activity.version = value["version"].get<int64_t>();
  if (!value.value("mailbox", json()).is_number_integer()) return bad("mailbox");
  activity.mailbox = value["mailbox"].get<int64_t>();
  if (!integers_from(value.value("keys_held", json()), &activity.keys_held))
    return bad("keys_held");
  if (!integers_from(value.value("keys_waiting", json()), &activity.keys_waiting))
    return bad("keys_waiting");
  if (!integers_from(value.value("staleness_histogram", json()), &activity.staleness_histogram))
    return bad("staleness_histogram");
  if (!note_from(value.value("last_received", json()), now_s, &activity.last_received))
    return bad("last_received");
  activity.working = value.value("working_on", json()).is_object();
  if (!note_from(value.value("last_sent", json()), now_s, &activity.last_sent))
    return bad("last_sent");
  return activity;
}

run_monitor::run_monitor(json info, int stage_actors, double origin_s, size_t span_capacity)
    : info_(std::move(info)),
      origin_s_(origin_s),
      span_capacity_(span_capacity),
      activity_(static_cast<size_t>(std::max(0, stage_actors))),
      busy_s_(activity_.size(), 0.0) {}

void run_monitor::add_record(const json& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  records_.push_back(line);
}

void run_monitor::note_step(int64_t step, int64_t total_steps, int64_t epoch,
                            double samples_per_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
  total_steps_ = total_steps;
  epoch_ = epoch;
  samples_per_s_ = samples_per_s;
}

void run_monitor::note_received(int actor, const message_note& note) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (actor < 0 || actor >= stage_actors()) return;
  stage_activity& activity = activity_[static_cast<size_t>(actor)];
  activity.last_received = note;
  activity.working = true;
}

void run_monitor::set_activity(int actor, const stage_activity& activity) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (actor < 0 || actor >= stage_actors()) return;
  stage_activity& kept = activity_[static_cast<size_t>(actor)];
  // Assigned field by field, so the vectors keep their buffers from one message to the next.
  kept.version = activity.version;
  kept.keys_held = activity.keys_held;
  kept.keys_waiting = activity.keys_waiting;
  kept.mailbox = activity.mailbox;
  // The host tells what it received as it takes it (note_received); a heartbeat tells both.
  if (!activity.last_received.kind.empty()) kept.last_received = activity.last_received;
  kept.last_sent = activity.last_sent;
  kept.staleness_histogram = activity.staleness_histogram;
  kept.working = activity.working;
}

void run_monitor::add_span(int track, const char* name, int64_t key, double start_s,
                           double duration_s) {
  const char* interned = interned_span_name(name);
  std::lock_guard<std::mutex> lock(mutex_);
  if (track >= 0 && track < stage_actors()) busy_s_[static_cast<size_t>(track)] += duration_s;
  if (span_capacity_ == 0) return;
  if (spans_.size() >= span_capacity_) spans_.pop_front();
  spans_.push_back({track, interned, key, start_s, duration_s});
}

void run_monitor::note_coordinator(double now_s, int64_t keys_in_flight) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_heard_s_ = now_s;
  keys_in_flight_ = keys_in_flight;
  stall_reported_ = false;
  stall_ = nullptr;
}

void run_monitor::set_processes(std::vector<hosting_process> processes, int restarts) {
  std::lock_guard<std::mutex> lock(mutex_);
  processes_ = std::move(processes);
  restarts_ = restarts;
}

void run_monitor::set_finished(json summary) {
  std::lock_guard<std::mutex> lock(mutex_);
  summary_ = std::move(summary);
  finished_ = true;
  stall_ = nullptr;
}

json run_monitor::heartbeat_json(const std::vector<int>& actors, double since_s,
                                 double now_s) const {
  std::lock_guard<std::mutex> lock(mutex_);
  json activity = json::array();
  for (int actor : actors) {
    if (actor < 0 || actor >= stage_actors()) continue;
    json entry = to_json(activity_[static_cast<size_t>(actor)], now_s);
    entry["actor"] = actor;
    activity.push_back(std::move(entry));
  }
  json spans = json::array();
  for (auto span = spans_.rbegin(); span != spans_.rend() && spans.size() < heartbeat_spans;
       ++span) {
    if (span->start_s + span->duration_s <= since_s) break;
    spans.push_back({span->track, span->name, span->key, now_s - span->start_s, span->duration_s});
  }
  std::reverse(spans.begin(), spans.end());
  return {{"activity", std::move(activity)}, {"spans", std::move(spans)}};
}

bool run_monitor::add_heartbeat(const json& heartbeat, const std::vector<int>& actors, double now_s,
                                std::string* error) {
  const auto hosted = [&](const json& actor) {
    return actor.is_number_integer() &&
           std::find(actors.begin(), actors.end(), actor.get<int>()) != actors.end() &&
           actor.get<int>() < stage_actors();
  };
  const json activity = heartbeat.value("activity", json::array());
  const json spans = heartbeat.value("spans", json::array());
  if (!activity.is_array() || !spans.is_array()) {
    *error = "\"activity\" and \"spans\" must be lists";
    return false;
  }
  std::vector<std::pair<int, stage_activity>> stages;
  for (const json& entry : activity) {
    if (!entry.is_object() || !hosted(entry.value("actor", json()))) {
      *error = "activity of a stage the worker does not host";
      return false;
    }
    auto parsed = stage_activity_from_json(entry, now_s, error);
    if (!parsed) return false;
    stages.emplace_back(entry["actor"].get<int>(), std::move(*parsed));
  }
  struct named_span {
    int track;
    std::string name;
    int64_t key;
    double start_s, duration_s;
  };
  std::vector<named_span> records;
  for (const json& span : spans) {
    if (!span.is_array() || span.size() != 5 || !hosted(span[0]) || !span[1].is_string() ||
        span[1].get<std::string>().size() > 32 || !span[2].is_number_integer() ||
        !span[3].is_number() || !span[4].is_number() || !(span[4].get<double>() >= 0)) {
      *error = "a span is not [stage, name, key, start_age_s, duration_s] of a hosted stage";
      return false;
    }
    records.push_back({span[0].get<int>(), span[1].get<std::string>(), span[2].get<int64_t>(),
                       now_s - span[3].get<double>(), span[4].get<double>()});
  }
  for (const auto& [actor, stage] : stages) set_activity(actor, stage);
  for (const named_span& span : records)
    add_span(span.track, span.name.c_str(), span.key, span.start_s, span.duration_s);
  return true;
}

bool run_monitor::stall_began(double now_s, double timeout_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (timeout_s <= 0 || finished_ || last_heard_s_ < 0 || keys_in_flight_ == 0 || stall_reported_ ||
      now_s - last_heard_s_ < timeout_s) {
    return false;
  }
  stall_reported_ = true;
  return true;
}

const hosting_process* run_monitor::process_of(int actor) const {
  for (const hosting_process& process : processes_) {
    if (std::find(process.stages.begin(), process.stages.end(), actor) != process.stages.end())
      return &process;
  }
  return nullptr;
}

json run_monitor::status_report(const std::string& event, double now_s) {
  std::lock_guard<std::mutex> lock(mutex_);
  json stages = json::array();
  for (int actor = 0; actor < stage_actors(); ++actor) {
    json entry = stage_entry(actor, now_s, "unknown");
    // A worker's silence is the first clue to a stopped or wedged process.
    const hosting_process* process = process_of(actor);
    entry["heartbeat_age_s"] = process ? heartbeat_age(*process, now_s) : 0.0;
    stages.push_back(std::move(entry));
  }
  json report = {{"event", event},
                 {"wall_s", now_s - origin_s_},
                 {"keys_in_flight", keys_in_flight_},
                 {"silent_s", last_heard_s_ < 0 ? 0.0 : now_s - last_heard_s_},
                 {"step", step_},
                 {"stages", std::move(stages)}};
  if (event == "stall") stall_ = report;
  return report;
}

json run_monitor::summary_json(double now_s) const {
  std::lock_guard<std::mutex> lock(mutex_);
  json summary = info_;
  summary["state"] = finished_                               ? "finished"
                     : !stall_.is_null()                     ? "stalled"
                     : last_heard_s_ < 0 && records_.empty() ? "starting"
                                                             : "running";
  const json latest = [&] {
    for (auto line = records_.rbegin(); line != records_.rend(); ++line)
      if (!line->contains("event")) return *line;
    return json();
  }();
  summary["latest"] = latest;
  summary["step"] = std::max<int64_t>(step_, latest.is_object() ? latest.value("step", 0) : 0);
  if (total_steps_ > 0) summary["total_steps"] = total_steps_;
  summary["epoch"] = std::max<int64_t>(epoch_, latest.is_object() ? latest.value("epoch", 0) : 0);
  double wall = now_s - origin_s_;
  if (finished_ && summary_.value("wall_s", json()).is_number()) {
    wall = summary_["wall_s"].get<double>();
  } else if (latest.is_object() && info_.value("source", "") != "live") {
    wall = latest.value("wall_s", 0.0);
  }
  summary["wall_s"] = wall;
  summary["samples_per_s"] =
      latest.is_object() ? latest.value("samples_per_s", samples_per_s_) : samples_per_s_;
  json workers = json::array();
  for (const hosting_process& process : processes_) {
    workers.push_back({{"name", process.name},
                       {"host", process.host},
                       {"pid", process.pid},
                       {"stages", process.stages},
                       {"heartbeat_age_s", heartbeat_age(process, now_s)}});
  }
  summary["workers"] = std::move(workers);
  summary["restarts"] = restarts_;
  summary["checkpoints"] = checkpoints_of(records_);
  summary["stall"] = stall_;
  summary["summary"] = finished_ ? summary_ : json();
  return summary;
}

json run_monitor::metrics_json(size_t since) const {
  std::lock_guard<std::mutex> lock(mutex_);
  json records = json::array();
  for (size_t i = since; i < records_.size(); ++i) records.push_back(records_[i]);
  return {{"next", std::max(since, records_.size())}, {"records", std::move(records)}};
}

double run_monitor::view_end(double now_s) const {
  return finished_ && !spans_.empty() ? spans_.back().start_s + spans_.back().duration_s : now_s;
}

run_monitor::span_iterator run_monitor::first_span_after(double from_s) const {
  auto first = spans_.end();
  while (first != spans_.begin()) {
    const span_record& span = *std::prev(first);
    if (span.start_s + span.duration_s < from_s - span_order_slack_s) break;
    --first;
  }
  return first;
}

double run_monitor::busy_share(int actor, double now_s, double window_s) const {
  const double from = now_s - window_s;
  double busy = 0;
  for (auto span = first_span_after(from); span != spans_.end(); ++span) {
    if (span->track != actor) continue;
    busy += std::max(
        0.0, std::min(now_s, span->start_s + span->duration_s) - std::max(from, span->start_s));
  }
  return std::min(1.0, busy / window_s);
}

double run_monitor::heartbeat_age(const hosting_process& process, double now_s) {
  return process.last_heard_s ? std::max(0.0, now_s - *process.last_heard_s) : 0.0;
}

json run_monitor::stage_entry(int actor, double now_s, const char* nobody) const {
  json entry = to_json(activity_[static_cast<size_t>(actor)], now_s);
  entry["actor"] = actor;
  const hosting_process* process = process_of(actor);
  entry["worker"] = process ? process->name : nobody;
  entry["host"] = process ? process->host : "";
  return entry;
}

json run_monitor::stages_json(double now_s) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const int per_replica = info_.value("stages", 1);
  // Over the last window of the run, or all of it when it is shorter; a finished run's window
  // ends at its last span.
  const double end = view_end(now_s);
  const double window = std::max(1e-9, std::min(utilization_window_s, end - origin_s_));
  json stages = json::array();
  for (int actor = 0; actor < stage_actors(); ++actor) {
    json entry = stage_entry(actor, now_s, "");
    const double share = busy_share(actor, end, window);
    entry["stage"] = actor % std::max(1, per_replica);
    entry["replica"] = actor / std::max(1, per_replica);
    entry["utilization"] = share;
    entry["idle"] = 1 - share;
    entry["busy_s"] = busy_s_[static_cast<size_t>(actor)];
    stages.push_back(std::move(entry));
  }
  return {{"window_s", window}, {"stages", std::move(stages)}};
}

json run_monitor::trace_json(double since_s, double now_s, double window_s) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const double end = view_end(now_s);
  const double from = std::max(origin_s_ + since_s, end - window_s);
  json spans = json::array();
  double next = since_s;
  for (auto span = first_span_after(from); span != spans_.end(); ++span) {
    const double span_end = span->start_s + span->duration_s;
    if (span_end <= from) continue;
    spans.push_back(
        {span->track, span->name, span->key, span->start_s - origin_s_, span->duration_s});
    next = std::max(next, span_end - origin_s_);
  }
  return {{"now_s", end - origin_s_}, {"next", next}, {"spans", std::move(spans)}};
}

std::string describe_status(const json& report) {
  char head[200];
  std::snprintf(head, sizeof head,
                "%s at %.1f s: %lld keys in flight, the coordinator heard nothing for %.1f s "
                "(step %lld)\n",
                report.value("event", std::string()) == "stall" ? "stalled" : "status",
                report.value("wall_s", 0.0),
                static_cast<long long>(report.value("keys_in_flight", int64_t{0})),
                report.value("silent_s", 0.0),
                static_cast<long long>(report.value("step", int64_t{0})));
  std::string text = head;
  for (const json& stage : report.value("stages", json::array())) {
    json received = stage.value("last_received", json());
    json sent = stage.value("last_sent", json());
    if (received.is_object()) received["direction"] = "from";
    if (sent.is_object()) sent["direction"] = "to";
    json working = stage.value("working_on", json());
    if (working.is_object()) working["direction"] = "from";
    std::string silence;
    if (const double age = stage.value("heartbeat_age_s", 0.0); age >= 1) {
      char seconds[64];
      std::snprintf(seconds, sizeof seconds, ", its last heartbeat %.1f s ago", age);
      silence = seconds;
    }
    text += "  stage " + std::to_string(stage.value("actor", -1)) + " (" +
            stage.value("worker", std::string("unknown")) + silence +
            "): " + (working.is_object() ? "still taking " + describe_note(working) + "; " : "") +
            "holds keys " + list_of(stage.value("keys_held", json())) + ", holds back " +
            list_of(stage.value("keys_waiting", json())) + ", mailbox " +
            std::to_string(stage.value("mailbox", int64_t{0})) + "; last received " +
            describe_note(received) + "; last sent " + describe_note(sent) + "\n";
  }
  return text;
}

}  // namespace troupe::actors
