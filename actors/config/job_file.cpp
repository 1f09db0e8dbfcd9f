#include "actors/config/job_file.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>

#include "actors/config/job_checks.h"
#include "actors/config/job_schema.h"
#include "actors/config/job_warnings.h"
#include "actors/config/layer_cuts.h"
#include "actors/config/node_schema.h"
#include "actors/config/toml_fields.h"

namespace troupe::actors {
namespace {

using namespace detail;  // the schema and the generic readers of toml_fields.h

/// "section.key" for every key of every section that `root` (the file with its overrides) sets.
std::set<std::string> keys_set_in(const toml::table& root) {
  std::set<std::string> keys;
  for (const auto& [name, node] : root) {
    if (const toml::table* table = node.as_table()) {
      for (const auto& entry : *table) {
        keys.insert(std::string(name.str()) + "." + std::string(entry.first.str()));
      }
    }
  }
  return keys;
}

problem read_job(const toml::table& root, const std::set<std::string>& overridden,
                 const std::set<std::string>& set_keys, job_config* config) {
  const std::vector<section> schema = job_schema(*config);
  std::vector<std::string> section_names, key_names;
  for (const auto& s : schema) {
    section_names.push_back(s.name);
    for (const auto& f : s.fields) key_names.push_back(s.name + "." + f.name);
  }
  for (const auto& [key, node] : root) {
    const std::string name(key.str());
    const bool known = std::count(section_names.begin(), section_names.end(), name) > 0;
    if (known && !node.is_table()) return wrong_type(name, "a table", node);
    if (!known && node.is_table()) {
      return "unknown section '" + name + "'" + suggestion(name, section_names);
    }
    if (!known) return "unknown key '" + name + "'" + suggestion(name, key_names);
  }
  static const toml::table kEmpty;
  for (const auto& s : schema) {
    const toml::table* table = root.get_as<toml::table>(s.name);
    const naming names{"", s.name + ".", key_names, &overridden};
    if (problem error = read_fields(table ? *table : kEmpty, s.fields, names)) return error;
  }
  return check_consistency(config, set_keys);
}

std::optional<job_config> fail(job_error* error, std::string message) {
  if (error != nullptr) error->message = std::move(message);
  return std::nullopt;
}

std::optional<job_config> parse_job_or_throw(const std::string& toml_text,
                                             const std::string& source_name,
                                             const std::vector<std::string>& overrides,
                                             job_error* error, std::vector<std::string>* warnings) {
  toml::table root;
  if (problem message = parse_toml(toml_text, source_name, &root)) return fail(error, *message);
  std::set<std::string> overridden;
  for (const auto& text : overrides) {
    problem message = is_node_override(text) ? apply_node_override(text, &root, &overridden)
                                             : apply_override(text, &root, &overridden);
    if (message) {
      return fail(error, source_name + ": " + *message);
    }
  }
  job_config config;
  const std::set<std::string> set_keys = keys_set_in(root);
  if (problem message = read_job(root, overridden, set_keys, &config)) {
    return fail(error, source_name + ": " + *message);
  }
  if (warnings != nullptr) {
    warnings->clear();
    for (const std::string& warning : job_warnings(config, set_keys)) {
      warnings->push_back(source_name + ": " + warning);
    }
  }
  return config;
}

}  // namespace

std::optional<job_config> parse_job(const std::string& toml_text, const std::string& source_name,
                                    const std::vector<std::string>& overrides, job_error* error,
                                    std::vector<std::string>* warnings) {
  try {
    return parse_job_or_throw(toml_text, source_name, overrides, error, warnings);
  } catch (const std::exception& exception) {
    return fail(error, source_name + ": " + exception.what());
  }
}

std::optional<job_config> load_job_file(const std::string& path,
                                        const std::vector<std::string>& overrides, job_error* error,
                                        std::vector<std::string>* warnings) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (file == nullptr) {
    return fail(error, "cannot open job file '" + path + "': " + std::strerror(errno));
  }
  std::string text;
  char buffer[1 << 14];
  size_t count = 0;
  while ((count = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) text.append(buffer, count);
  if (std::ferror(file.get())) {
    return fail(error, "cannot read job file '" + path + "': " + std::strerror(errno));
  }
  return parse_job(text, path, overrides, error, warnings);
}

nlohmann::json to_json(const job_config& config) {
  // The job as its file writes it (a cut linear layer whole); the schema binds to a mutable
  // config, and writing only reads it.
  job_config copy = written_job(config);
  nlohmann::json json = nlohmann::json::object();
  for (const auto& s : job_schema(copy)) {
    nlohmann::json& keys = json[s.name] = nlohmann::json::object();
    for (const auto& f : s.fields) {
      if (f.is_written()) keys[f.name] = f.write();
    }
  }
  return json;
}

namespace {

std::string fnv1a_hex(const nlohmann::json& json) {
  const std::string text = json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  uint64_t hash = 14695981039346656037ull;  // FNV-1a 64
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

}  // namespace

std::string config_hash(const job_config& config) { return fnv1a_hex(to_json(config)); }

std::string job_identity_hash(const job_config& config) {
  // Its checkpoints resume on any layout; a worker of another layout is another job's.
  return checkpoint_config_hash(config) + "-r" + std::to_string(config.parallelism.replicas) +
         "-s" + std::to_string(config.parallelism.stages);
}

std::string checkpoint_config_hash(const job_config& config) {
  nlohmann::json json = to_json(config);
  json.erase("checkpoint");
  json.erase("metrics");
  for (const char* key : {"epochs", "max_steps", "target_accuracy", "eval_interval_steps"}) {
    json["training"].erase(key);
  }
  // A run may resume with another number of replicas (a checkpoint holds one copy of each
  // stage) and another partition (actors/storage/checkpoint_recut.h cuts it again), whose
  // default max_active_keys follows the stage count.
  for (const char* key : {"threads", "spin_wait_ms", "devices", "replicas", "collective", "stages",
                          "partition", "max_active_keys"}) {
    json["parallelism"].erase(key);
  }
  json["model"].erase("init_from");
  return fnv1a_hex(json);
}

}  // namespace troupe::actors
