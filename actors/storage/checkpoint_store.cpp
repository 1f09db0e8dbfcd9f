#include "actors/storage/checkpoint_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>

#include "actors/config/json_text.h"
#include "actors/engine/stage_state.h"
#include "actors/storage/file_descriptor.h"
#include "layers/regular_file.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* const manifest_name = "manifest.json";
const char* const latest_name = "latest";
/// Reads and writes go in pieces of this size, so that a 1 GB shard is hashed while it streams
/// through the cache instead of in a second pass.
constexpr size_t io_chunk = size_t{8} << 20;
/// A manifest is a few kilobytes; anything far larger is not one and is not read whole.
constexpr off_t largest_manifest = off_t{16} << 20;

bool fail(std::string* error, std::string message) {
  *error = std::move(message);
  return false;
}

bool fail_errno(std::string* error, const std::string& path, const char* what, int number) {
  return fail(error, path + ": " + what + ": " + std::strerror(number));
}

std::string hex_of(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

/// Reads the whole of `path` into `contents`, checking its size against `expected_bytes` before
/// reading anything and hashing each piece as it arrives; `actual_xxh3` receives the hash.
bool read_hashed(const std::string& path, uint64_t expected_bytes, std::string* contents,
                 std::string* actual_xxh3, std::string* error) {
  // A FIFO planted where a shard belongs is refused, not waited on.
  uint64_t size = 0;
  file_descriptor file(layers::open_regular_file(path, error, &size));
  if (file.get() < 0) return false;
  if (size != expected_bytes) {
    return fail(error, path + ": " + std::to_string(size) + " bytes, the manifest says " +
                           std::to_string(expected_bytes) +
                           (size < expected_bytes ? " (truncated)" : " (longer than written)"));
  }
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  if (!state || XXH3_64bits_reset(state.get()) != XXH_OK) throw std::bad_alloc();
  contents->resize(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t got =
        ::read(file.get(), contents->data() + done, std::min(size - done, io_chunk));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return fail_errno(error, path, "cannot read", errno);
    if (got == 0) return fail(error, path + ": ends after " + std::to_string(done) + " bytes");
    XXH3_64bits_update(state.get(), contents->data() + done, static_cast<size_t>(got));
    done += static_cast<size_t>(got);
  }
  *actual_xxh3 = hex_of(XXH3_64bits_digest(state.get()));
  return true;
}

/// Reads a small text file (a manifest); `missing` tells a file that is absent from other errors.
bool read_text(const std::string& path, std::string* text, bool* missing, std::string* error) {
  uint64_t size = 0;
  file_descriptor file(layers::open_regular_file(path, error, &size, missing));
  if (file.get() < 0) return false;
  if (size > largest_manifest) {
    return fail(error, path + ": " + std::to_string(size) + " bytes, too large for a manifest");
  }
  text->resize(static_cast<size_t>(size));
  size_t done = 0;
  while (done < text->size()) {
    const ssize_t got = ::read(file.get(), text->data() + done, text->size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return fail_errno(error, path, "cannot read", errno);
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  text->resize(done);
  return true;
}

/// N of a directory named step-N (digits only, no leading zero), or nothing.
std::optional<int64_t> step_of(const std::string& name) {
  const std::string prefix = "step-";
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > 18 || (digits.size() > 1 && digits[0] == '0') ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

/// DIRECTORY/manifest.json parsed and validated; the error names that file.
std::optional<checkpoint_manifest> read_manifest(const fs::path& directory, std::string* error) {
  const std::string path = (directory / manifest_name).string();
  std::string text;
  bool missing = false;
  if (!read_text(path, &text, &missing, error)) {
    if (missing) *error = path + ": missing (not a committed checkpoint)";
    return std::nullopt;
  }
  std::string problem;
  const std::optional<json> parsed = parse_json_text(text, &problem);
  if (!parsed) {
    fail(error, path + ": " + problem);
    return std::nullopt;
  }
  auto manifest = manifest_from_json(*parsed, error);
  if (!manifest) *error = path + ": " + *error;
  return manifest;
}

struct step_directory {
  int64_t step = 0;
  fs::path path;
  bool committed = false;
};

/// The step-N subdirectories of `root`, highest N first; `committed` when the manifest parses.
std::vector<step_directory> step_directories(const fs::path& root) {
  std::vector<step_directory> found;
  std::error_code failure;
  for (fs::directory_iterator it(root, failure), end; !failure && it != end;
       it.increment(failure)) {
    const auto step = step_of(it->path().filename().string());
    std::error_code type_failure;
    if (!step || !it->is_directory(type_failure)) continue;
    std::string ignored;
    found.push_back({*step, it->path(), read_manifest(it->path(), &ignored).has_value()});
  }
  std::sort(found.begin(), found.end(),
            [](const step_directory& a, const step_directory& b) { return a.step > b.step; });
  return found;
}

/// Creates ROOT and an empty DIRECTORY, removing what an earlier attempt left there.
bool prepare_directory(file_system& files, const fs::path& root, const fs::path& directory,
                       std::string* error) {
  return files.create_directories(root.string(), error) &&
         files.remove_all(directory.string(), error) &&
         files.create_directories(directory.string(), error);
}

bool write_shards(file_system& files, const fs::path& directory,
                  const std::vector<std::string>& shards, checkpoint_manifest* manifest,
                  std::string* error) {
  manifest->shards.clear();
  for (size_t i = 0; i < shards.size(); ++i) {
    shard_entry entry;
    entry.stage = static_cast<int32_t>(i);
    entry.file = "stage-" + std::to_string(i) + ".shard";
    entry.bytes = shards[i].size();
    entry.xxh3 = xxh3_hex(shards[i].data(), shards[i].size());
    if (!files.write_synced((directory / entry.file).string(), shards[i], error)) return false;
    manifest->shards.push_back(std::move(entry));
  }
  return true;
}

/// Removes committed checkpoints beyond `keep_last` (counting the one just committed first)
/// and uncommitted leftovers older than it. A failure here costs disk space, not data, so it
/// is reported and the commit still stands.
void prune(file_system& files, const fs::path& root, int64_t newest, int keep_last) {
  int kept = 1;
  for (const step_directory& entry : step_directories(root)) {
    if (entry.step == newest) continue;
    bool remove = !entry.committed && entry.step < newest;
    if (entry.committed) remove = keep_last > 0 && kept >= keep_last;
    if (entry.committed && !remove) ++kept;
    if (!remove) continue;
    std::string failure;
    if (!files.remove_all(entry.path.string(), &failure))
      std::fprintf(stderr, "troupe: cannot remove old checkpoint: %s\n", failure.c_str());
  }
}

bool commit_checkpoint(file_system& files, const fs::path& root, int keep_last,
                       checkpoint_manifest manifest, const std::vector<std::string>& shards,
                       std::string* error) {
  if (manifest.step < 0) return fail(error, root.string() + ": cannot commit a negative step");
  if (shards.empty() || shards.size() != static_cast<size_t>(manifest.stages)) {
    return fail(error, root.string() + ": " + std::to_string(shards.size()) +
                           " shards for a manifest of " + std::to_string(manifest.stages) +
                           " stages");
  }
  const std::string name = "step-" + std::to_string(manifest.step);
  const fs::path directory = root / name;
  if (!prepare_directory(files, root, directory, error) ||
      !write_shards(files, directory, shards, &manifest, error) ||
      !files.sync_directory(directory.string(), error) ||
      !files.sync_directory(root.string(), error)) {
    return false;
  }
  // The creation time is for people reading the manifest; nothing in a run decides on it.
  if (manifest.created_unix_s == 0) {
    manifest.created_unix_s =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  if (!files.write_atomically((directory / manifest_name).string(),
                              to_json(manifest).dump(2) + "\n", error) ||
      !files.write_atomically((root / latest_name).string(), name + "\n", error)) {
    return false;
  }
  prune(files, root, manifest.step, keep_last);
  return true;
}

std::optional<loaded_checkpoint> load_verified(const fs::path& directory,
                                               const std::string& config_hash, std::string* error) {
  auto manifest = read_manifest(directory, error);
  if (!manifest) return std::nullopt;
  const std::string manifest_path = (directory / manifest_name).string();
  if (!config_hash.empty() && manifest->config_hash != config_hash) {
    fail(error, manifest_path + ": written by a job with config hash " + manifest->config_hash +
                    ", this job's is " + config_hash);
    return std::nullopt;
  }
  const auto named_step = step_of(directory.filename().string());
  if (named_step && *named_step != manifest->step) {
    fail(error, manifest_path + ": says step " + std::to_string(manifest->step) + " but lies in " +
                    directory.filename().string());
    return std::nullopt;
  }
  loaded_checkpoint loaded;
  loaded.directory = directory.string();
  loaded.shards.resize(manifest->shards.size());
  for (size_t i = 0; i < manifest->shards.size(); ++i) {
    const shard_entry& entry = manifest->shards[i];
    const std::string path = (directory / entry.file).string();
    std::string actual;
    if (!read_hashed(path, entry.bytes, &loaded.shards[i], &actual, error)) return std::nullopt;
    if (actual != entry.xxh3) {
      fail(error, path + ": checksum " + actual + " does not match the manifest's " + entry.xxh3);
      return std::nullopt;
    }
    // A checksum says the bytes are the ones the manifest lists, not that they are a stage's:
    // a shard forged together with its manifest, or another stage's, is refused here too.
    std::string problem;
    const auto counters =
        parse_stage_state_counters(loaded.shards[i].data(), loaded.shards[i].size(), &problem);
    if (counters && (counters->stage != entry.stage || counters->stages != manifest->stages)) {
      problem = "holds the state of stage " + std::to_string(counters->stage) + " of " +
                std::to_string(counters->stages) + ", where the manifest lists stage " +
                std::to_string(entry.stage) + " of " + std::to_string(manifest->stages);
    }
    if (!problem.empty()) {
      fail(error, path + ": " + problem);
      return std::nullopt;
    }
  }
  loaded.manifest = std::move(*manifest);
  return loaded;
}

/// The last name of `path`, ignoring trailing slashes ("runs/x/step-10/" → "runs/x/step-10").
fs::path without_trailing_slash(const std::string& path) {
  fs::path result(path);
  while (!result.has_filename() && result.has_parent_path() && result != result.root_path()) {
    result = result.parent_path();
  }
  return result;
}

bool has_step_directories(const fs::path& directory) {
  std::error_code failure;
  for (fs::directory_iterator it(directory, failure), end; !failure && it != end;
       it.increment(failure)) {
    std::error_code type_failure;
    if (step_of(it->path().filename().string()) && it->is_directory(type_failure)) return true;
  }
  return false;
}

std::string joined(const std::vector<std::string>& problems) {
  std::string text;
  for (const std::string& problem : problems) text += (text.empty() ? "" : "; ") + problem;
  return text;
}

/// A named checkpoint, or else the newest older one in the same directory that verifies.
std::optional<loaded_checkpoint> load_named(const fs::path& directory,
                                            const std::string& config_hash,
                                            std::vector<std::string>* problems) {
  std::string error;
  auto loaded = load_checkpoint(directory.string(), config_hash, &error);
  if (loaded) return loaded;
  problems->push_back(error);
  const auto named_step = step_of(directory.filename().string());
  const fs::path parent = directory.has_parent_path() ? directory.parent_path() : fs::path(".");
  for (const step_directory& entry : step_directories(parent)) {
    if (!entry.committed || (named_step && entry.step >= *named_step)) continue;
    if (entry.path.filename() == directory.filename()) continue;
    loaded = load_checkpoint(entry.path.string(), config_hash, &error);
    if (loaded) return loaded;
    problems->push_back(error);
  }
  return std::nullopt;
}

std::optional<loaded_checkpoint> resolve(const std::string& path, const std::string& config_hash,
                                         std::vector<std::string>* problems, std::string* error) {
  const fs::path named = without_trailing_slash(path);
  std::error_code failure;
  const size_t problems_before = problems->size();
  std::optional<loaded_checkpoint> loaded;
  fs::path searched = named;
  if (fs::exists(named / manifest_name, failure) || step_of(named.filename().string())) {
    loaded = load_named(named, config_hash, problems);
  } else if (has_step_directories(named)) {
    loaded = checkpoint_store(named.string(), 0).load_latest(config_hash, problems);
  } else if (fs::is_directory(named / "checkpoints", failure)) {
    searched = named / "checkpoints";
    loaded = checkpoint_store(searched.string(), 0).load_latest(config_hash, problems);
  } else {
    fail(error, "no checkpoint at " + path);
    return std::nullopt;
  }
  if (loaded) return loaded;
  const std::vector<std::string> why(problems->begin() + problems_before, problems->end());
  fail(error, "no checkpoint in " + searched.string() + " loads" +
                  (why.empty() ? std::string(" (none is committed)") : ": " + joined(why)));
  return std::nullopt;
}

}  // namespace

std::optional<loaded_checkpoint> load_checkpoint(const std::string& directory,
                                                 const std::string& config_hash,
                                                 std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  try {
    return load_verified(fs::path(directory), config_hash, error);
  } catch (const std::bad_alloc&) {
    fail(error, directory + ": not enough memory to load the checkpoint");
  } catch (const std::exception& problem) {
    fail(error, directory + ": " + problem.what());
  }
  return std::nullopt;
}

std::string xxh3_hex(const void* data, size_t bytes) { return hex_of(XXH3_64bits(data, bytes)); }

checkpoint_store::checkpoint_store(std::string root, int keep_last, file_system& files)
    : root_(std::move(root)), keep_last_(keep_last), files_(&files) {}

bool checkpoint_store::commit(checkpoint_manifest manifest, const std::vector<std::string>& shards,
                              std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  try {
    return commit_checkpoint(*files_, fs::path(root_), keep_last_, std::move(manifest), shards,
                             error);
  } catch (const std::exception& problem) {
    return fail(error, root_ + ": " + problem.what());
  }
}

std::vector<std::string> checkpoint_store::committed() const {
  std::vector<std::string> directories;
  try {
    for (const step_directory& entry : step_directories(fs::path(root_))) {
      if (entry.committed) directories.push_back(entry.path.string());
    }
  } catch (const std::exception&) {
    // Only allocation can throw here; an unreadable root simply holds no checkpoint.
  }
  return directories;
}

std::optional<loaded_checkpoint> checkpoint_store::load_latest(
    const std::string& config_hash, std::vector<std::string>* problems) const {
  std::vector<std::string> ignored;
  if (problems == nullptr) problems = &ignored;
  try {
    // Every step directory newer than the one that loads is reported, the uncommitted ones too
    // (a save cut short, a manifest spoilt): a resume should say what it passed over.
    for (const step_directory& entry : step_directories(fs::path(root_))) {
      std::string error;
      auto loaded = entry.committed ? load_checkpoint(entry.path.string(), config_hash, &error)
                                    : std::nullopt;
      if (loaded) return loaded;
      if (!entry.committed) read_manifest(entry.path, &error);
      problems->push_back(error);
    }
  } catch (const std::exception& problem) {
    problems->push_back(root_ + ": " + problem.what());
  }
  return std::nullopt;
}

std::optional<loaded_checkpoint> resolve_resume(const std::string& path,
                                                const std::string& config_hash,
                                                std::vector<std::string>* problems,
                                                std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  std::vector<std::string> own_problems;
  if (problems == nullptr) problems = &own_problems;
  try {
    return resolve(path, config_hash, problems, error);
  } catch (const std::exception& problem) {
    fail(error, path + ": " + problem.what());
  }
  return std::nullopt;
}

}  // namespace troupe::actors
