#include "apps/cli/model_files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "actors/config/job_file.h"
#include "actors/config/json_text.h"
#include "actors/storage/file_system.h"
#include "actors/storage/model_weights.h"
#include "actors/storage/safetensors.h"

namespace troupe::apps {

std::optional<std::vector<actors::stage_state>> parse_shards(
    const actors::loaded_checkpoint& checkpoint, std::string* error) {
  std::vector<actors::stage_state> states;
  for (size_t i = 0; i < checkpoint.shards.size(); ++i) {
    const std::string file =
        checkpoint.directory + "/" +
        (i < checkpoint.manifest.shards.size() ? checkpoint.manifest.shards[i].file
                                               : "stage-" + std::to_string(i) + ".shard");
    std::string problem;
    auto state = actors::parse_stage_state(checkpoint.shards[i].data(), checkpoint.shards[i].size(),
                                           &problem);
    if (state && state->stage != static_cast<int32_t>(i)) {
      problem = "it holds stage " + std::to_string(state->stage) + " in place of stage " +
                std::to_string(i);
      state.reset();
    }
    if (!state) {
      *error = file + ": " + problem;
      return std::nullopt;
    }
    states.push_back(std::move(*state));
  }
  return states;
}

std::optional<std::vector<actors::named_tensor>> read_weights(const std::string& path,
                                                              std::string* error) {
  if (std::filesystem::is_regular_file(path)) return actors::read_safetensors(path, error);
  std::vector<std::string> problems;
  auto checkpoint = actors::resolve_resume(path, "", &problems, error);
  if (!checkpoint) return std::nullopt;
  auto states = parse_shards(*checkpoint, error);
  if (!states) return std::nullopt;
  return actors::export_tensors(*states);
}

namespace {

/// A JSON value as TOML: the same text for scalars and arrays, inline tables for objects.
std::string toml_value(const nlohmann::json& value) {
  if (value.is_object()) {
    std::string text = "{ ";
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      text += (first ? "" : ", ") + key + " = " + toml_value(item);
      first = false;
    }
    return text + " }";
  }
  if (value.is_array()) {
    std::string text = "[";
    for (size_t i = 0; i < value.size(); ++i) text += (i ? ", " : "") + toml_value(value[i]);
    return text + "]";
  }
  return value.dump();
}

}  // namespace

std::optional<actors::job_config> load_job_json(const std::string& path, std::string* error) {
  std::string unreadable;
  const std::optional<std::string> text = actors::posix_files().read(path, &unreadable);
  std::optional<nlohmann::json> parsed;
  if (text) parsed = actors::parse_json_text(*text, &unreadable);
  if (!parsed) {
    *error = text ? path + ": " + unreadable : unreadable;
    return std::nullopt;
  }
  const nlohmann::json& json = *parsed;
  if (!json.is_object()) {
    *error = path + " is not a job's JSON object";
    return std::nullopt;
  }
  std::ostringstream toml;
  for (const auto& [section, keys] : json.items()) {
    if (!keys.is_object()) continue;
    toml << "[" << section << "]\n";
    for (const auto& [key, value] : keys.items()) {
      if (!value.is_null()) toml << key << " = " << toml_value(value) << "\n";
    }
  }
  actors::job_error problem;
  auto config = actors::parse_job(toml.str(), path, {}, &problem);
  if (!config) *error = problem.message;
  return config;
}

std::optional<actors::job_config> job_of_weights(const std::string& path,
                                                 const std::string& job_file, std::string* error) {
  if (!job_file.empty()) {
    actors::job_error problem;
    auto config = actors::load_job_file(job_file, {}, &problem);
    if (!config) *error = problem.message;
    return config;
  }
  std::filesystem::path directory = std::filesystem::absolute(path);
  if (!std::filesystem::is_directory(directory)) directory = directory.parent_path();
  for (int level = 0; level < 4 && !directory.empty(); ++level) {
    const std::filesystem::path candidate = directory / "config.json";
    if (std::filesystem::is_regular_file(candidate))
      return load_job_json(candidate.string(), error);
    if (directory == directory.parent_path()) break;
    directory = directory.parent_path();
  }
  *error = "no config.json of the run found above " + path + "; name the job with --job FILE";
  return std::nullopt;
}

}  // namespace troupe::apps
