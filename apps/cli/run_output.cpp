#include "apps/cli/run_output.h"

#include <cstdio>
#include <filesystem>

#include "actors/storage/file_system.h"

namespace troupe::apps {

bool make_directory(const std::string& directory, std::string* error) {
  std::error_code code;
  std::filesystem::create_directories(directory, code);
  if (code) {
    *error = "cannot create output directory " + directory + ": " + code.message();
    return false;
  }
  return true;
}

bool write_json_file(const std::string& path, const nlohmann::json& value, std::string* error) {
  return actors::posix_files().write_atomically(path, value.dump(2) + "\n", error);
}

int write_json_output(const std::string& path, const nlohmann::json& value) {
  std::string error;
  if (write_json_file(path, value, &error)) return 0;
  std::fprintf(stderr, "troupe: %s\n", error.c_str());
  return 1;
}

bool write_trace_file(const actors::trace_recorder& trace, const std::string& path,
                      std::string* error) {
  return actors::posix_files().write_atomically(path, trace.to_json().dump() + "\n", error);
}

nlohmann::json to_json(const actors::metrics_record& record) {
  nlohmann::json line = {{"step", record.step},
                         {"epoch", record.epoch},
                         {"loss", record.loss},
                         {"lr", record.learning_rate},
                         {"samples_per_s", record.samples_per_s},
                         {"wall_s", record.wall_s}};
  if (record.test_accuracy) line["test_accuracy"] = *record.test_accuracy;
  if (record.test_loss) line["test_loss"] = *record.test_loss;
  if (record.tokens_per_s) line["tokens_per_s"] = *record.tokens_per_s;
  if (record.bits_per_byte) {
    line["validation_loss"] = *record.test_loss;
    line["bits_per_byte"] = *record.bits_per_byte;
  }
  return line;
}

nlohmann::json to_json(const actors::training_summary& summary) {
  nlohmann::json value = {{"final_test_accuracy", summary.final_test_accuracy},
                          {"final_test_loss", summary.final_test_loss},
                          {"epochs", summary.epochs},
                          {"steps", summary.steps},
                          {"samples_per_s", summary.samples_per_s},
                          {"wall_s", summary.wall_s},
                          {"evaluated", summary.evaluated}};
  value["time_to_target_s"] =
      summary.time_to_target_s ? nlohmann::json(*summary.time_to_target_s) : nlohmann::json();
  value["steps_to_target"] =
      summary.steps_to_target ? nlohmann::json(*summary.steps_to_target) : nlohmann::json();
  if (summary.tokens_per_s) value["tokens_per_s"] = *summary.tokens_per_s;
  if (summary.bits_per_byte) {
    value["validation_loss"] = summary.final_test_loss;
    value["bits_per_byte"] = *summary.bits_per_byte;
  }
  return value;
}

metrics_log::metrics_log(const std::string& path, bool append)
    : file_(path, append ? std::ios::app : std::ios::trunc) {}

void metrics_log::append(const nlohmann::json& line) {
  file_ << line.dump() << '\n';
  file_.flush();
}

}  // namespace troupe::apps
