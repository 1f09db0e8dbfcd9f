// `troupe inspect PATH`: what a checkpoint holds and whether it is whole. PATH is a step
// directory (that checkpoint), a checkpoints directory or a run's output directory (the newest
// committed checkpoint that verifies, as --resume would pick it, naming the ones it skipped).
// Exit status: 0 verified, 1 a file is damaged, 2 no checkpoint there.

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/job_file.h"
#include "actors/config/json_text.h"
#include "actors/config/layer_cuts.h"
#include "actors/engine/stage_state.h"
#include "actors/storage/checkpoint_store.h"
#include "actors/storage/file_system.h"
#include "apps/cli/commands.h"
#include "apps/cli/model_files.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;

int refuse(int status, const std::string& problem) {
  std::fprintf(stderr, "troupe inspect: %s\n", problem.c_str());
  return status;
}

bool is_step_name(const std::string& name) {
  return name.size() > 5 && name.compare(0, 5, "step-") == 0 &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

/// PATH without trailing slashes, so that "runs/x/step-10/" is named step-10.
fs::path named_path(const std::string& path) {
  fs::path result(path);
  while (!result.has_filename() && result.has_parent_path() && result != result.root_path()) {
    result = result.parent_path();
  }
  return result;
}

bool is_step_directory(const fs::path& path) {
  std::error_code failure;
  return fs::exists(path / "manifest.json", failure) || is_step_name(path.filename().string());
}

bool has_step_directories(const fs::path& directory) {
  std::error_code failure;
  for (fs::directory_iterator it(directory, failure), end; !failure && it != end;
       it.increment(failure)) {
    std::error_code type_failure;
    if (is_step_name(it->path().filename().string()) && it->is_directory(type_failure)) {
      return true;
    }
  }
  return false;
}

std::string utc_time(double unix_seconds) {
  const std::time_t seconds = static_cast<std::time_t>(unix_seconds);
  std::tm parts{};
  char text[64] = "?";
  if (gmtime_r(&seconds, &parts) != nullptr) {
    std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &parts);
  }
  return text;
}

void print_manifest(const std::string& directory, const actors::checkpoint_manifest& manifest) {
  std::printf("checkpoint %s\n", directory.c_str());
  std::printf("  job           %s\n", manifest.job.c_str());
  std::printf("  step          %lld\n", static_cast<long long>(manifest.step));
  std::printf("  epoch         %lld\n", static_cast<long long>(manifest.epoch));
  std::printf("  config hash   %s\n", manifest.config_hash.c_str());
  std::printf("  created       %s (unix %.3f)\n", utc_time(manifest.created_unix_s).c_str(),
              manifest.created_unix_s);
  std::printf("  stages        %d\n", manifest.stages);
  std::printf("  shards:\n");
  for (const actors::shard_entry& shard : manifest.shards) {
    std::printf("    stage %-3d %-18s %14llu bytes  xxh3 %s\n", shard.stage, shard.file.c_str(),
                static_cast<unsigned long long>(shard.bytes), shard.xxh3.c_str());
  }
  std::printf("  coordinator   %s\n", manifest.coordinator.dump().c_str());
}

/// Prints what DIRECTORY/manifest.json says, when it says anything, before the verification
/// that failed on some other file is reported.
void print_manifest_if_readable(const fs::path& directory) {
  std::string ignored;
  const std::optional<std::string> text =
      actors::posix_files().read((directory / "manifest.json").string(), &ignored);
  if (!text) return;
  const auto json = actors::parse_json_text(*text, &ignored);
  const auto manifest = json ? actors::manifest_from_json(*json, &ignored) : std::nullopt;
  if (manifest) print_manifest(directory.string(), *manifest);
}

/// A stage's blocks as the run's job file numbers them ("[0, 4:784)" for a stage that ends
/// inside layer 4) when `job` is the run's and holds them, else as the checkpoint does.
std::string block_range(const actors::stage_state& state,
                        const std::optional<actors::job_config>& job) {
  const auto blocks = job ? job->model.layers.size() : 0;
  if (state.first_block < 0 || state.last_block < state.first_block ||
      static_cast<size_t>(state.last_block) > blocks) {
    return "[" + std::to_string(state.first_block) + ", " + std::to_string(state.last_block) + ")";
  }
  return "[" + actors::written_bound(*job, static_cast<size_t>(state.first_block)) + ", " +
         actors::written_bound(*job, static_cast<size_t>(state.last_block)) + ")";
}

void print_stage(size_t index, const actors::stage_state& state,
                 const std::optional<actors::job_config>& job) {
  int64_t parameter_values = 0;
  for (const auto& tensor : state.parameters) {
    parameter_values += static_cast<int64_t>(tensor.values.size());
  }
  std::printf(
      "    stage %zu: blocks %s, %zu parameter tensors (%lld values), %zu gradient "
      "tensors, %zu optimizer tensors, %lld values in all, weight version %lld, optimizer "
      "steps %lld\n",
      index, block_range(state, job).c_str(), state.parameters.size(),
      static_cast<long long>(parameter_values), state.gradients.size(),
      state.optimizer_state.size(), static_cast<long long>(actors::stage_state_values(state)),
      static_cast<long long>(state.weight_version), static_cast<long long>(state.optimizer_steps));
}

/// The job of the run whose checkpoint is at `directory` (its config.json), when it is the one
/// the checkpoint was taken under.
std::optional<actors::job_config> job_of_checkpoint(const actors::loaded_checkpoint& checkpoint) {
  std::string ignored;
  auto job = job_of_weights(checkpoint.directory, "", &ignored);
  if (!job || actors::checkpoint_config_hash(*job) != checkpoint.manifest.config_hash) {
    return std::nullopt;
  }
  return job;
}

/// Parses every shard and prints what each stage holds; false, with `error` naming the
/// shard's file, when one does not parse or holds another stage than the manifest says.
bool verify_stages(const actors::loaded_checkpoint& checkpoint, std::string* error) {
  const std::optional<actors::job_config> job = job_of_checkpoint(checkpoint);
  std::printf("verified sizes and xxh3 checksums of %zu shards; stage states:\n",
              checkpoint.shards.size());
  for (size_t i = 0; i < checkpoint.shards.size(); ++i) {
    const std::string file = checkpoint.directory + "/" + checkpoint.manifest.shards[i].file;
    std::string problem;
    auto state = actors::parse_stage_state(checkpoint.shards[i].data(), checkpoint.shards[i].size(),
                                           &problem);
    if (state &&
        (state->stage != static_cast<int32_t>(i) || state->stages != checkpoint.manifest.stages)) {
      problem = "holds stage " + std::to_string(state->stage) + " of " +
                std::to_string(state->stages) + ", the manifest says stage " + std::to_string(i) +
                " of " + std::to_string(checkpoint.manifest.stages);
      state.reset();
    }
    if (!state) {
      *error = file + ": " + problem;
      return false;
    }
    print_stage(i, *state, job);
  }
  return true;
}

/// Prints and verifies a checkpoint that loaded; 0 when every stage parses, else 1.
int report(const actors::loaded_checkpoint& checkpoint, size_t skipped) {
  print_manifest(checkpoint.directory, checkpoint.manifest);
  std::string error;
  if (!verify_stages(checkpoint, &error)) return refuse(1, error);
  std::printf("ok: step %lld verifies", static_cast<long long>(checkpoint.manifest.step));
  if (skipped > 0) std::printf(" (%zu newer step directories skipped, see above)", skipped);
  std::printf("\n");
  return 0;
}

int inspect_step(const fs::path& directory) {
  std::string error;
  const auto checkpoint = actors::load_checkpoint(directory.string(), "", &error);
  if (checkpoint) return report(*checkpoint, 0);
  std::error_code failure;
  if (!fs::exists(directory / "manifest.json", failure)) return refuse(2, error);
  print_manifest_if_readable(directory);
  return refuse(1, error);
}

/// The newest committed checkpoint of DIRECTORY that verifies, naming the newer ones skipped.
int inspect_collection(const fs::path& directory) {
  const actors::checkpoint_store store(directory.string(), 0);
  std::vector<std::string> problems;
  const auto checkpoint = store.load_latest("", &problems);
  for (const std::string& problem : problems) std::printf("skipped: %s\n", problem.c_str());
  std::string unreadable;
  const std::optional<std::string> latest =
      actors::posix_files().read((directory / "latest").string(), &unreadable);
  const std::string named = latest ? latest->substr(0, latest->find('\n')) : "";
  if (!named.empty()) std::printf("%s/latest names %s\n", directory.c_str(), named.c_str());
  if (checkpoint) return report(*checkpoint, problems.size());
  if (store.committed().empty()) {
    return refuse(2,
                  directory.string() + " holds no committed checkpoint (no step-N/manifest.json)");
  }
  return refuse(
      1, "no checkpoint in " + directory.string() + " verifies; the newest: " + problems.front());
}

}  // namespace

int run_inspect(const inspect_options& options) {
  const fs::path path = named_path(options.path);
  std::error_code failure;
  if (options.path.empty() || !fs::exists(path, failure)) {
    return refuse(2, options.path + ": no such file or directory");
  }
  try {
    if (is_step_directory(path)) return inspect_step(path);
    if (has_step_directories(path)) return inspect_collection(path);
    if (fs::is_directory(path / "checkpoints", failure))
      return inspect_collection(path / "checkpoints");
  } catch (const std::exception& problem) {
    return refuse(1, options.path + ": " + problem.what());
  }
  return refuse(2, options.path +
                       " holds no checkpoint (no manifest.json, no step-N directories, no "
                       "checkpoints/)");
}

}  // namespace troupe::apps
