// `troupe bench checkpoint`: how long a checkpoint takes to save (serialize every stage's state,
// write and fsync the shards, commit the manifest) and to load (read and verify the shards,
// parse them back), for the example MLP and for a model of about 200 million parameters. The
// shards are dropped from the page cache after each save, so that loads read the disk as a
// resume after a restart would.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/job_file.h"
#include "actors/engine/partition.h"
#include "actors/engine/stage_device.h"
#include "actors/engine/stage_state.h"
#include "actors/storage/checkpoint_store.h"
#include "apps/bench/bench_models.h"
#include "apps/cli/commands.h"
#include "apps/cli/run_signals.h"
#include "apps/lab/statistics.h"
#include "layers/backend_registry.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

const char* const example_job = "apps/examples/fashion_mlp.toml";

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

constexpr const char* scratch_prefix = "troupe-bench-checkpoint-";

/// Set by SIGTERM or SIGINT: the benchmark stops after its current round and removes its shards.
std::atomic<bool> interrupted{false};

void on_interrupt(int) { interrupted.store(true); }

/// Removes the scratch directories of earlier benchmarks whose process is gone (killed before
/// it could remove them).
void remove_abandoned_scratch(const fs::path& temp) {
  std::error_code ignored;
  for (const fs::directory_entry& entry : fs::directory_iterator(temp, ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(scratch_prefix, 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + std::strlen(scratch_prefix), &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) fs::remove_all(entry, ignored);
  }
}

/// A directory under the system temp directory, removed with its contents when it goes.
class scratch_directory {
 public:
  scratch_directory()
      : path_(fs::temp_directory_path() / (scratch_prefix + std::to_string(::getpid()))) {
    remove_abandoned_scratch(fs::temp_directory_path());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~scratch_directory() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  scratch_directory(const scratch_directory&) = delete;
  scratch_directory& operator=(const scratch_directory&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

/// The example job file, looked for from the working directory and from the executable's
/// place in a build tree (build/apps/troupe).
std::optional<std::string> find_example_job() {
  std::error_code failure;
  const fs::path executable = fs::read_symlink("/proc/self/exe", failure);
  std::vector<fs::path> candidates = {example_job};
  if (!failure) candidates.push_back(executable.parent_path() / "../.." / example_job);
  for (const fs::path& candidate : candidates) {
    if (fs::exists(candidate, failure)) return candidate.lexically_normal().string();
  }
  return std::nullopt;
}

/// About 201 million parameters: 8192 inputs, three 8192-wide linear layers and a 10-way one,
/// SGD with momentum (so a velocity per weight), on 4 stages.
actors::job_config large_model() {
  actors::job_config config = mlp_job({8192, 8192, 8192, 8192, 10}, 64);
  config.data.dataset = actors::dataset_kind::synthetic;
  config.parallelism.stages = 4;
  return config;
}

/// Every stage's state as save_state gives it, one stage device alive at a time so that the
/// large model's weights exist only twice (device and host copy) for one stage at once.
std::optional<std::vector<actors::stage_state>> stage_states(const actors::job_config& config,
                                                             layers::backend& device,
                                                             std::string* error) {
  auto ranges = actors::partition_model(config, error);
  if (!ranges) return std::nullopt;
  std::vector<actors::stage_state> states;
  for (size_t i = 0; i < ranges->size(); ++i) {
    actors::stage_state state =
        actors::make_layers_stage_device(config, (*ranges)[i], device)->save_state();
    state.stage = static_cast<int32_t>(i);
    state.stages = static_cast<int32_t>(ranges->size());
    states.push_back(std::move(state));
  }
  return states;
}

struct measurement {
  std::string model;
  int64_t parameters = 0;
  uint64_t bytes = 0;
  int rounds = 0;
  std::vector<double> serialize_s, commit_s, read_s, parse_s;

  double save_s() const { return median(serialize_s) + median(commit_s); }
  double load_s() const { return median(read_s) + median(parse_s); }
};

/// Asks the kernel to forget the cached pages of DIRECTORY's files (clean after the fsync of
/// the commit), so that the next load reads them from the disk.
void drop_from_page_cache(const fs::path& directory) {
  std::error_code failure;
  for (fs::directory_iterator it(directory, failure), end; !failure && it != end;
       it.increment(failure)) {
    const int file = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (file < 0) continue;
    ::posix_fadvise(file, 0, 0, POSIX_FADV_DONTNEED);
    ::close(file);
  }
}

/// Serializes and commits `states` as `manifest`'s step, timing both.
bool save_round(const std::vector<actors::stage_state>& states,
                const actors::checkpoint_manifest& manifest, actors::checkpoint_store& store,
                measurement* result, std::string* error) {
  auto start = clock_type::now();
  std::vector<std::string> shards;
  for (const actors::stage_state& state : states) {
    shards.push_back(actors::serialize_stage_state(state));
  }
  result->serialize_s.push_back(seconds_since(start));
  result->bytes = 0;
  for (const std::string& shard : shards) result->bytes += shard.size();
  start = clock_type::now();
  if (!store.commit(manifest, shards, error)) return false;
  result->commit_s.push_back(seconds_since(start));
  return true;
}

/// Loads, verifies and parses checkpoint DIRECTORY, timing reading and parsing.
bool load_round(const std::string& directory, const std::string& config_hash, measurement* result,
                std::string* error) {
  auto start = clock_type::now();
  auto checkpoint = actors::load_checkpoint(directory, config_hash, error);
  if (!checkpoint) return false;
  result->read_s.push_back(seconds_since(start));
  start = clock_type::now();
  for (std::string& shard : checkpoint->shards) {
    if (!actors::parse_stage_state(shard.data(), shard.size(), error)) return false;
    std::string().swap(shard);  // as a resume would, once the stage holds its state
  }
  result->parse_s.push_back(seconds_since(start));
  return true;
}

int64_t parameter_count(const std::vector<actors::stage_state>& states) {
  int64_t count = 0;
  for (const actors::stage_state& state : states) {
    for (const actors::named_tensor& tensor : state.parameters) {
      count += static_cast<int64_t>(tensor.values.size());
    }
  }
  return count;
}

void say(bool loud, const char* what) {
  if (loud) std::fprintf(stderr, "troupe bench checkpoint: %s\n", what);
}

/// Save and load rounds of `config`'s checkpoint for about `budget` seconds (at least one).
/// With `once` (the large model), one round, and the states are freed before the load.
std::optional<measurement> measure(const std::string& name, const actors::job_config& config,
                                   layers::backend& device, const fs::path& root, double budget,
                                   bool once, std::string* error) {
  measurement result;
  result.model = name;
  say(once, "building the model's stage states...");
  auto states = stage_states(config, device, error);
  if (!states) return std::nullopt;
  result.parameters = parameter_count(*states);
  actors::checkpoint_store store((root / ("model-" + std::to_string(result.parameters))).string(),
                                 2);
  actors::checkpoint_manifest manifest;
  manifest.job = name;
  manifest.config_hash = actors::checkpoint_config_hash(config);
  manifest.stages = static_cast<int32_t>(states->size());
  const auto start = clock_type::now();
  do {
    manifest.step = result.rounds + 1;
    say(once, "saving...");
    if (!save_round(*states, manifest, store, &result, error)) return std::nullopt;
    const fs::path directory = fs::path(store.root()) / ("step-" + std::to_string(manifest.step));
    drop_from_page_cache(directory);
    if (once) std::vector<actors::stage_state>().swap(*states);
    say(once, "loading...");
    if (!load_round(directory.string(), manifest.config_hash, &result, error)) return std::nullopt;
    ++result.rounds;
  } while (!once && seconds_since(start) < budget && !interrupted.load());
  return result;
}

double megabytes_per_second(uint64_t bytes, double seconds) { return bytes / seconds / 1e6; }

void print_table(const std::vector<measurement>& results) {
  std::printf("%-34s %12s %14s %8s %10s %8s %10s\n", "model", "parameters", "bytes", "save s",
              "save MB/s", "load s", "load MB/s");
  for (const measurement& m : results) {
    std::printf("%-34s %12lld %14llu %8.3f %10.1f %8.3f %10.1f\n", m.model.c_str(),
                static_cast<long long>(m.parameters), static_cast<unsigned long long>(m.bytes),
                m.save_s(), megabytes_per_second(m.bytes, m.save_s()), m.load_s(),
                megabytes_per_second(m.bytes, m.load_s()));
  }
  std::printf(
      "(medians over rounds; save = serialize + write, fsync and commit; load = read and\n"
      " verify + parse)\n");
  for (const measurement& m : results) {
    std::printf(
        "  %-32s %d rounds: serialize %.3f s, commit %.3f s, read+verify %.3f s, "
        "parse %.3f s\n",
        m.model.c_str(), m.rounds, median(m.serialize_s), median(m.commit_s), median(m.read_s),
        median(m.parse_s));
  }
}

nlohmann::json to_json(const measurement& m) {
  return {{"model", m.model},
          {"parameters", m.parameters},
          {"bytes", m.bytes},
          {"rounds", m.rounds},
          {"save_s", m.save_s()},
          {"save_mb_per_s", megabytes_per_second(m.bytes, m.save_s())},
          {"load_s", m.load_s()},
          {"load_mb_per_s", megabytes_per_second(m.bytes, m.load_s())},
          {"serialize_s", median(m.serialize_s)},
          {"commit_s", median(m.commit_s)},
          {"read_verify_s", median(m.read_s)},
          {"parse_s", median(m.parse_s)}};
}

struct model_case {
  std::string name;
  actors::job_config config;
  bool once = false;  ///< one round, states freed before the load (too large to keep twice)
};

/// The models to measure: the example MLP (when its job file is found) and the large one.
std::vector<model_case> models() {
  std::vector<model_case> list;
  actors::job_error problem;
  const auto path = find_example_job();
  const auto example = path ? actors::load_job_file(*path, {}, &problem) : std::nullopt;
  if (example) {
    list.push_back(
        {"fashion_mlp (" + std::to_string(example->parallelism.stages) + " stages)", *example});
  } else {
    std::fprintf(stderr, "troupe bench checkpoint: skipping the example MLP: %s\n",
                 path ? problem.message.c_str() : "apps/examples/fashion_mlp.toml not found");
  }
  list.push_back({"mlp 8192x3+10 (4 stages)", large_model(), true});
  return list;
}

bool write_json(const std::string& path, const std::string& device,
                const std::vector<measurement>& results) {
  nlohmann::json models = nlohmann::json::array();
  for (const measurement& m : results) models.push_back(to_json(m));
  std::ofstream file(path);
  file << nlohmann::json{{"device", device}, {"models", models}}.dump(2) << "\n";
  return static_cast<bool>(file);
}

}  // namespace

int run_bench_checkpoint(const bench_options& options) {
  std::string error;
  auto device = layers::create_backend(options.device, options.threads, &error);
  if (!device) {
    std::fprintf(stderr, "troupe: --device: %s\n", error.c_str());
    return 2;
  }
  std::vector<measurement> results;
  handle_signals(on_interrupt, {SIGINT, SIGTERM});
  try {
    scratch_directory scratch;
    std::printf(
        "troupe bench checkpoint: states from %s, shards in %s, dropped from the page "
        "cache before each load\n",
        device->name().c_str(), scratch.path().c_str());
    std::fflush(stdout);
    for (const model_case& model : models()) {
      auto result = measure(model.name, model.config, *device, scratch.path(), options.seconds,
                            model.once, &error);
      if (!result) {
        std::fprintf(stderr, "troupe bench checkpoint: %s: %s\n", model.name.c_str(),
                     error.c_str());
        return 1;
      }
      results.push_back(std::move(*result));
      if (interrupted.load()) {
        std::fprintf(stderr, "troupe bench checkpoint: interrupted; removing %s\n",
                     scratch.path().c_str());
        return 130;
      }
    }
  } catch (const std::exception& problem) {
    std::fprintf(stderr, "troupe bench checkpoint: %s\n", problem.what());
    return 1;
  }
  print_table(results);
  if (!options.json_file.empty() && !write_json(options.json_file, device->name(), results)) {
    std::fprintf(stderr, "troupe: cannot write %s\n", options.json_file.c_str());
    return 1;
  }
  return 0;
}

}  // namespace troupe::apps
