// troupe dashboard RUN_DIR: the dashboard of a run directory (troupe train) or a simulation's
// (troupe simulate --out), read from its files, and read again when they change.

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>

#include "apps/cli/commands.h"
#include "apps/dashboard/dashboard_server.h"

namespace troupe::apps {
namespace {

using json = nlohmann::json;

const char* const run_files[] = {"metrics.jsonl", "summary.json", "config.json", "trace.json"};

/// A file's modification time and size, or {0, -1} when it is not there.
std::pair<int64_t, int64_t> file_stamp(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return {0, -1};
  return {static_cast<int64_t>(info.st_mtim.tv_sec) * 1'000'000'000 + info.st_mtim.tv_nsec,
          static_cast<int64_t>(info.st_size)};
}

/// The JSON in `path`: null when it is not there, nothing (with `error` set) when malformed.
std::optional<json> read_json(const std::string& path, std::string* error) {
  std::ifstream file(path);
  if (!file) return json();
  json value = json::parse(file, nullptr, false);
  if (value.is_discarded()) {
    *error = path + ": not valid JSON";
    return std::nullopt;
  }
  return value;
}

/// The lines of metrics.jsonl; a last line without its newline is one being written, and left
/// out. Nothing, with `error` naming the line, when a line is not a JSON object.
std::optional<std::vector<json>> read_metrics(const std::string& path, std::string* error) {
  std::ifstream file(path);
  std::vector<json> lines;
  if (!file) return lines;
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  size_t start = 0, number = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    ++number;
    const std::string line = text.substr(start, end - start);
    if (line.empty()) continue;
    json value = json::parse(line, nullptr, false);
    if (value.is_discarded() || !value.is_object()) {
      *error = path + " line " + std::to_string(number) + ": not a JSON object";
      return std::nullopt;
    }
    lines.push_back(std::move(value));
  }
  return lines;
}

struct trace_span {
  int track;
  std::string name;
  int64_t key;
  double start_s, duration_s;
};

/// The work spans of a trace.json (Chrome's format as trace_recorder writes it).
std::vector<trace_span> spans_of(const json& trace) {
  std::vector<trace_span> spans;
  if (!trace.is_object() || !trace.value("traceEvents", json()).is_array()) return spans;
  for (const json& event : trace["traceEvents"]) {
    if (!event.is_object() || event.value("ph", "") != "X" || event.value("cat", "") != "work" ||
        !event.value("tid", json()).is_number_integer() || !event.value("ts", json()).is_number() ||
        !event.value("dur", json()).is_number()) {
      continue;
    }
    const json args = event.value("args", json::object());
    spans.push_back({event["tid"].get<int>() - 1, event.value("name", std::string()),
                     args.is_object() ? args.value("key", int64_t{-1}) : -1,
                     event["ts"].get<double>() / 1e6, event["dur"].get<double>() / 1e6});
  }
  std::sort(spans.begin(), spans.end(), [](const trace_span& a, const trace_span& b) {
    return a.start_s + a.duration_s < b.start_s + b.duration_s;
  });
  return spans;
}

/// The monitor of the run in `directory`, and the time to show it at. Nothing, with `error`
/// set, when a file is malformed or the directory holds no run.
std::optional<dashboard_view> load_run(const std::string& directory, std::string* error) {
  auto metrics = read_metrics(directory + "/metrics.jsonl", error);
  if (!metrics) return std::nullopt;
  auto summary = read_json(directory + "/summary.json", error);
  if (!summary) return std::nullopt;
  auto config = read_json(directory + "/config.json", error);
  if (!config) return std::nullopt;
  auto trace = read_json(directory + "/trace.json", error);
  if (!trace) return std::nullopt;
  if (metrics->empty() && summary->is_null() && trace->is_null()) {
    *error = directory + " holds no metrics.jsonl, summary.json or trace.json: not a run directory";
    return std::nullopt;
  }
  const std::vector<trace_span> spans = spans_of(*trace);
  const json parallelism =
      config->is_object() ? config->value("parallelism", json::object()) : json::object();
  const bool simulation = config->is_null() && summary->is_object() && summary->contains("events");
  json info = {{"job", std::filesystem::path(directory).filename().string()},
               {"source", simulation ? "simulation" : "run directory"},
               {"directory", directory},
               {"mode", parallelism.value("mode", std::string())},
               {"schedule", parallelism.value("schedule", std::string())},
               {"stages", parallelism.value("stages", 1)},
               {"replicas", parallelism.value("replicas", 1)}};
  if (config->is_object())
    info["epochs"] = config->value("training", json::object()).value("epochs", int64_t{0});
  const json summary_stages = summary->is_object() && summary->value("stages", json()).is_array()
                                  ? (*summary)["stages"]
                                  : json::array();
  int actors = info["stages"].get<int>() * info["replicas"].get<int>();
  actors = std::max<int>(actors, static_cast<int>(summary_stages.size()));
  double origin = spans.empty() ? 0 : spans.front().start_s, end = origin;
  for (const trace_span& span : spans) {
    actors = std::max(actors, span.track + 1);
    origin = std::min(origin, span.start_s);
    end = std::max(end, span.start_s + span.duration_s);
  }
  auto monitor = std::make_shared<actors::run_monitor>(info, actors, origin);
  for (const json& line : *metrics) monitor->add_record(line);
  for (const trace_span& span : spans)
    monitor->add_span(span.track, span.name.c_str(), span.key, span.start_s, span.duration_s);
  for (size_t i = 0; i < summary_stages.size(); ++i) {
    actors::stage_activity activity;
    activity.version = summary_stages[i].value("optimizer_steps", int64_t{0});
    activity.staleness_histogram =
        summary_stages[i].value("staleness_histogram", std::vector<int64_t>{});
    monitor->set_activity(static_cast<int>(i), activity);
  }
  if (!metrics->empty()) end = std::max(end, origin + metrics->back().value("wall_s", 0.0));
  if (summary->is_object() && summary->value("processes", json()).is_array()) {
    std::vector<actors::hosting_process> processes;
    for (const json& process : (*summary)["processes"]) {
      if (!process.is_object() || process.value("role", "") == "coordinator") continue;
      std::vector<int> stages;
      for (const json& stage : process.value("stages", json::array()))
        if (stage.is_number_integer()) stages.push_back(stage.get<int>());
      const int64_t pid = process.value("pid", int64_t{0});
      processes.push_back({process.value("role", "") == "worker"
                               ? "worker pid " + std::to_string(pid)
                               : "the run's process",
                           process.value("host", std::string()), pid, stages, std::nullopt});
    }
    monitor->set_processes(std::move(processes), 0);
  }
  if (summary->is_object()) monitor->set_finished(*summary);
  return dashboard_view{monitor, end};
}

/// The run directory's view, loaded again whenever one of its files changed.
class run_directory_view {
 public:
  explicit run_directory_view(std::string directory) : directory_(std::move(directory)) {}

  bool load(std::string* error) {
    auto view = load_run(directory_, error);
    if (!view) return false;
    view_ = *view;
    stamps_ = stamps();
    return true;
  }

  dashboard_view current() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stamps() != stamps_) {
      std::string error;
      if (!load(&error))
        std::fprintf(stderr, "troupe dashboard: kept the last view: %s\n", error.c_str());
    }
    return view_;
  }

 private:
  std::vector<std::pair<int64_t, int64_t>> stamps() const {
    std::vector<std::pair<int64_t, int64_t>> all;
    for (const char* name : run_files) all.push_back(file_stamp(directory_ + "/" + name));
    return all;
  }

  const std::string directory_;
  std::mutex mutex_;
  dashboard_view view_;
  std::vector<std::pair<int64_t, int64_t>> stamps_;
};

}  // namespace

int run_dashboard(const dashboard_options& options) {
  std::string error;
  auto address = parse_dashboard_address(options.address, options.token, &error, "--listen");
  if (!address) {
    std::fprintf(stderr, "troupe dashboard: %s\n", error.c_str());
    return 2;
  }
  struct stat info {};
  if (::stat(options.run_directory.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    std::fprintf(stderr, "troupe dashboard: %s is not a directory\n",
                 options.run_directory.c_str());
    return 2;
  }
  auto view = std::make_shared<run_directory_view>(options.run_directory);
  if (!view->load(&error)) {
    std::fprintf(stderr, "troupe dashboard: %s\n", error.c_str());
    return 2;
  }
  // Signals are taken by sigwait below, not by handlers on the server's threads.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  dashboard_server server([view] { return view->current(); }, options.token);
  if (!server.start(*address, &error)) {
    std::fprintf(stderr, "troupe dashboard: %s\n", error.c_str());
    return 2;
  }
  std::fprintf(stderr, "troupe dashboard: serving %s at http://%s:%d/ (Ctrl-C stops)\n",
               options.run_directory.c_str(), address->host.c_str(), server.port());
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  server.stop();
  return 0;
}

}  // namespace troupe::apps
