#pragma once

// The files a run leaves in its output directory: config.json, metrics.jsonl, summary.json.

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "actors/engine/run_reports.h"
#include "actors/engine/trace_recorder.h"

namespace troupe::apps {

/// Creates `directory` (and parents); false with `error` set when that fails.
bool make_directory(const std::string& directory, std::string* error);

/// Writes `value` to `path` atomically (temporary file, fsync, rename), so a reader never
/// sees half a file. False with `error` set on failure.
bool write_json_file(const std::string& path, const nlohmann::json& value, std::string* error);

/// write_json_file(), saying on stderr why it failed: 0, or 1 as a command's exit status.
int write_json_output(const std::string& path, const nlohmann::json& value);

/// Writes `trace` as Chrome trace JSON to `path` atomically. False with `error` set on failure.
bool write_trace_file(const actors::trace_recorder& trace, const std::string& path,
                      std::string* error);

nlohmann::json to_json(const actors::metrics_record& record);
nlohmann::json to_json(const actors::training_summary& summary);

/// Appends one JSON object per line to DIR/metrics.jsonl, flushed after every line.
class metrics_log {
 public:
  /// Truncates or creates the file (with `append`, adds to it: a resumed run); check ok().
  explicit metrics_log(const std::string& path, bool append = false);
  bool ok() const { return static_cast<bool>(file_); }
  void append(const nlohmann::json& line);

 private:
  std::ofstream file_;
};

}  // namespace troupe::apps
