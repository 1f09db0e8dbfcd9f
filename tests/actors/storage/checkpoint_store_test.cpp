#include "actors/storage/checkpoint_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "actors/engine/stage_state.h"
#include "tests/support/file_system_fakes.h"

namespace troupe::actors {
namespace {

using testing::faulty_file_system;

namespace fs = std::filesystem;

const std::string job_hash = "0123456789abcdef";

/// A fresh directory under the system temp directory, removed with everything in it at the end.
class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ =
        fs::temp_directory_path() / ("troupe-checkpoint-" + std::string(info->name()) + "-" +
                                     std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string checkpoints() const { return (root_ / "checkpoints").string(); }
  std::string step_directory(int64_t step) const {
    return checkpoints() + "/step-" + std::to_string(step);
  }

  fs::path root_;
};

checkpoint_manifest manifest_for(int64_t step, const std::string& hash = job_hash) {
  checkpoint_manifest manifest;
  manifest.job = "unit";
  manifest.config_hash = hash;
  manifest.step = step;
  manifest.epoch = step / 10;
  manifest.stages = 2;
  manifest.coordinator = {{"step", step}, {"samples", step * 64}};
  return manifest;
}

/// A stage's shard of `step`: its counters and a tensor whose values differ per step and stage.
stage_state state_for(int64_t step, int stage) {
  stage_state state;
  state.stage = stage;
  state.stages = 2;
  state.first_block = stage * 2;
  state.last_block = stage * 2 + 2;
  state.weight_version = step;
  state.optimizer_steps = step;
  state.parameters.push_back({"linear.weight", {250 + stage * 9}, {}});
  for (int i = 0; i < 250 + stage * 9; ++i)
    state.parameters.back().values.push_back(static_cast<float>(step * 1000 + stage * 100 + i));
  return state;
}

/// Shard bytes that differ per step and stage and include zero bytes.
std::vector<std::string> shards_for(int64_t step) {
  return {serialize_stage_state(state_for(step, 0)), serialize_stage_state(state_for(step, 1))};
}

/// Replaces a committed shard by `bytes` and makes the manifest vouch for them (size and
/// checksum), as someone who forged both would.
void forge_shard(const fs::path& directory, int stage, const std::string& bytes);

void commit_step(checkpoint_store& store, int64_t step, const std::string& hash = job_hash) {
  std::string error;
  ASSERT_TRUE(store.commit(manifest_for(step, hash), shards_for(step), &error)) << error;
}

std::string read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

void forge_shard(const fs::path& directory, int stage, const std::string& bytes) {
  const std::string file = "stage-" + std::to_string(stage) + ".shard";
  write_file(directory / file, bytes);
  auto json = nlohmann::json::parse(read_file(directory / "manifest.json"));
  json["shards"][stage]["bytes"] = bytes.size();
  json["shards"][stage]["xxh3"] = xxh3_hex(bytes.data(), bytes.size());
  write_file(directory / "manifest.json", json.dump());
}

std::vector<std::string> names_of(const std::vector<std::string>& paths) {
  std::vector<std::string> names;
  for (const std::string& path : paths) names.push_back(fs::path(path).filename().string());
  return names;
}

TEST_F(CheckpointStoreTest, CommitWritesShardsManifestAndLatest) {
  checkpoint_store store(checkpoints(), 0);
  commit_step(store, 10);
  const fs::path directory = step_directory(10);
  EXPECT_EQ(read_file(directory / "stage-0.shard"), shards_for(10)[0]);
  EXPECT_EQ(read_file(directory / "stage-1.shard"), shards_for(10)[1]);
  EXPECT_FALSE(fs::exists(directory / "manifest.json.tmp"));
  EXPECT_EQ(read_file(fs::path(checkpoints()) / "latest"), "step-10\n");

  const auto json = nlohmann::json::parse(read_file(directory / "manifest.json"));
  EXPECT_EQ(json["format"], 1);
  EXPECT_EQ(json["job"], "unit");
  EXPECT_EQ(json["config_hash"], job_hash);
  EXPECT_EQ(json["step"], 10);
  EXPECT_EQ(json["epoch"], 1);
  EXPECT_EQ(json["stages"], 2);
  EXPECT_EQ(json["coordinator"]["samples"], 640);
  EXPECT_GT(json["created_unix_s"].get<double>(), 1.6e9);
  ASSERT_EQ(json["shards"].size(), 2u);
  EXPECT_EQ(json["shards"][1]["stage"], 1);
  EXPECT_EQ(json["shards"][1]["file"], "stage-1.shard");
  EXPECT_EQ(json["shards"][1]["bytes"], shards_for(10)[1].size());
  EXPECT_EQ(json["shards"][1]["xxh3"],
            xxh3_hex(shards_for(10)[1].data(), shards_for(10)[1].size()));

  std::string error;
  auto loaded = load_checkpoint(directory.string(), job_hash, &error);
  ASSERT_TRUE(loaded) << error;
  EXPECT_EQ(loaded->shards, shards_for(10));
  EXPECT_EQ(loaded->manifest.step, 10);
  EXPECT_EQ(loaded->manifest.coordinator["samples"], 640);
  EXPECT_EQ(loaded->directory, directory.string());
}

TEST_F(CheckpointStoreTest, Xxh3HexIsSixteenLowercaseDigits) {
  EXPECT_EQ(xxh3_hex("", 0), "2d06800538d394c2");  // XXH3_64bits of no bytes, seed 0
  EXPECT_EQ(xxh3_hex("abc", 3).size(), 16u);
  EXPECT_NE(xxh3_hex("abc", 3), xxh3_hex("abd", 3));
}

TEST_F(CheckpointStoreTest, CommittedListsNewestFirstAndIgnoresOtherDirectories) {
  checkpoint_store store(checkpoints(), 0);
  for (int64_t step : {20, 5, 100, 30}) commit_step(store, step);
  fs::create_directories(fs::path(checkpoints()) / "step-200");  // no manifest: not committed
  fs::create_directories(fs::path(checkpoints()) / "step-x");
  fs::create_directories(fs::path(checkpoints()) / "notes");
  EXPECT_EQ(names_of(store.committed()),
            (std::vector<std::string>{"step-100", "step-30", "step-20", "step-5"}));
  EXPECT_EQ(read_file(fs::path(checkpoints()) / "latest"), "step-30\n");
}

TEST_F(CheckpointStoreTest, KeepLastPrunesOlderCommittedCheckpoints) {
  checkpoint_store store(checkpoints(), 2);
  for (int64_t step = 10; step <= 50; step += 10) commit_step(store, step);
  EXPECT_EQ(names_of(store.committed()), (std::vector<std::string>{"step-50", "step-40"}));
  EXPECT_FALSE(fs::exists(step_directory(30)));
  EXPECT_FALSE(fs::exists(step_directory(10)));
}

TEST_F(CheckpointStoreTest, CommitRemovesOlderUncommittedDirectories) {
  checkpoint_store store(checkpoints(), 0);
  commit_step(store, 10);
  fs::create_directories(step_directory(15));
  write_file(fs::path(step_directory(15)) / "stage-0.shard", "half written");
  fs::create_directories(step_directory(90));  // newer than the commit: left alone
  commit_step(store, 20);
  EXPECT_FALSE(fs::exists(step_directory(15)));
  EXPECT_TRUE(fs::exists(step_directory(90)));
  EXPECT_EQ(names_of(store.committed()), (std::vector<std::string>{"step-20", "step-10"}));
}

TEST_F(CheckpointStoreTest, CommitRewritesAnExistingStep) {
  checkpoint_store store(checkpoints(), 0);
  commit_step(store, 10);
  write_file(fs::path(step_directory(10)) / "stray.file", "left over");
  const std::vector<std::string> shards = {serialize_stage_state(state_for(11, 0)),
                                           serialize_stage_state(state_for(11, 1))};
  std::string error;
  ASSERT_TRUE(store.commit(manifest_for(10), shards, &error)) << error;
  EXPECT_FALSE(fs::exists(fs::path(step_directory(10)) / "stray.file"));
  auto loaded = load_checkpoint(step_directory(10), job_hash, &error);
  ASSERT_TRUE(loaded) << error;
  EXPECT_EQ(loaded->shards, shards);
}

TEST_F(CheckpointStoreTest, CommitRefusesShardsThatDoNotMatchTheStages) {
  checkpoint_store store(checkpoints(), 0);
  std::string error;
  EXPECT_FALSE(store.commit(manifest_for(10), {"only one"}, &error));
  EXPECT_NE(error.find("1 shards for a manifest of 2 stages"), std::string::npos) << error;
  EXPECT_TRUE(store.committed().empty());
}

TEST_F(CheckpointStoreTest, ManifestRoundTripsThroughJson) {
  checkpoint_manifest manifest = manifest_for(40);
  manifest.created_unix_s = 1700000000.5;
  manifest.shards = {{0, "stage-0.shard", 12, "00000000000000ff"},
                     {1, "stage-1.shard", 34, "0123456789abcdef"}};
  std::string error;
  auto back = manifest_from_json(to_json(manifest), &error);
  ASSERT_TRUE(back) << error;
  EXPECT_EQ(to_json(*back), to_json(manifest));
}

/// The error manifest_from_json gives after `edit` changes a valid manifest's JSON.
std::string manifest_error(const std::function<void(nlohmann::json&)>& edit) {
  checkpoint_manifest manifest = manifest_for(40);
  manifest.shards = {{0, "stage-0.shard", 12, "00000000000000ff"},
                     {1, "stage-1.shard", 34, "0123456789abcdef"}};
  nlohmann::json json = to_json(manifest);
  edit(json);
  std::string error;
  EXPECT_FALSE(manifest_from_json(json, &error));
  return error;
}

TEST_F(CheckpointStoreTest, ManifestFromJsonNamesTheBadField) {
  EXPECT_EQ(manifest_error([](auto& j) { j["shards"][1].erase("bytes"); }),
            "manifest field 'shards[1].bytes' is missing or not an unsigned integer");
  EXPECT_EQ(manifest_error([](auto& j) { j["shards"][0]["bytes"] = -3; }),
            "manifest field 'shards[0].bytes' is missing or not an unsigned integer");
  EXPECT_EQ(manifest_error([](auto& j) { j["job"] = 7; }),
            "manifest field 'job' is missing or not a string");
  EXPECT_EQ(manifest_error([](auto& j) { j["step"] = "ten"; }),
            "manifest field 'step' is missing or not an integer");
  EXPECT_NE(manifest_error([](auto& j) { j["step"] = -1; }).find("'step' is negative"),
            std::string::npos);
  EXPECT_NE(manifest_error([](auto& j) { j["stages"] = 0; }).find("'stages'"), std::string::npos);
  EXPECT_NE(manifest_error([](auto& j) { j["stages"] = 3; }).find("2 shards for 3 stages"),
            std::string::npos);
  EXPECT_NE(manifest_error([](auto& j) {
              j["shards"][1]["file"] = "../stage-1.shard";
            }).find("'shards[1].file'"),
            std::string::npos);
  EXPECT_NE(manifest_error([](auto& j) {
              j["shards"][0]["file"] = "sub/stage-0.shard";
            }).find("'shards[0].file'"),
            std::string::npos);
  EXPECT_NE(manifest_error([](auto& j) { j["shards"][0]["xxh3"] = "XYZ"; }).find("xxh3"),
            std::string::npos);
  EXPECT_NE(manifest_error([](auto& j) { j["format"] = 2; }).find("format 2"), std::string::npos);
  EXPECT_EQ(manifest_error([](auto& j) { j = nlohmann::json::array(); }),
            "the manifest is not a JSON object");
}

/// Step 10 and step 20 committed; `damage` spoils step 20. Load must refuse step 20 with an
/// error naming `file`, and load_latest must fall back to step 10, recording the problem.
void expect_detected(const std::string& root, const std::function<void(const fs::path&)>& damage,
                     const std::string& file, const std::string& says) {
  checkpoint_store store(root, 0);
  commit_step(store, 10);
  commit_step(store, 20);
  const fs::path directory = fs::path(root) / "step-20";
  damage(directory);
  std::string error;
  EXPECT_FALSE(load_checkpoint(directory.string(), job_hash, &error));
  EXPECT_NE(error.find((directory / file).string()), std::string::npos) << error;
  EXPECT_NE(error.find(says), std::string::npos) << error;
  std::vector<std::string> problems;
  auto latest = store.load_latest(job_hash, &problems);
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->manifest.step, 10);
  EXPECT_EQ(latest->shards, shards_for(10));
  EXPECT_EQ(problems, std::vector<std::string>{error});
}

TEST_F(CheckpointStoreTest, DetectsATruncatedShard) {
  expect_detected(
      checkpoints(), [](const fs::path& d) { fs::resize_file(d / "stage-1.shard", 100); },
      "stage-1.shard",
      "100 bytes, the manifest says " + std::to_string(shards_for(20)[1].size()) + " (truncated)");
}

TEST_F(CheckpointStoreTest, DetectsAFlippedByte) {
  expect_detected(
      checkpoints(),
      [](const fs::path& d) {
        std::string bytes = read_file(d / "stage-0.shard");
        bytes[bytes.size() / 2] ^= 0x01;
        write_file(d / "stage-0.shard", bytes);
      },
      "stage-0.shard", "does not match the manifest's");
}

TEST_F(CheckpointStoreTest, DetectsAMissingShard) {
  expect_detected(
      checkpoints(), [](const fs::path& d) { fs::remove(d / "stage-1.shard"); }, "stage-1.shard",
      "missing");
}

TEST_F(CheckpointStoreTest, DetectsAMissingManifest) {
  // Without its manifest step 20 is no longer committed.
  expect_detected(
      checkpoints(), [](const fs::path& d) { fs::remove(d / "manifest.json"); }, "manifest.json",
      "missing (not a committed checkpoint)");
  EXPECT_EQ(names_of(checkpoint_store(checkpoints(), 0).committed()),
            std::vector<std::string>{"step-10"});
}

TEST_F(CheckpointStoreTest, DetectsAManifestThatIsNotJson) {
  expect_detected(
      checkpoints(),
      [](const fs::path& d) { write_file(d / "manifest.json", "{\"format\": 1, \"job\":"); },
      "manifest.json", "not valid JSON");
}

TEST_F(CheckpointStoreTest, DetectsAManifestWithABadField) {
  expect_detected(
      checkpoints(),
      [](const fs::path& d) {
        auto json = nlohmann::json::parse(read_file(d / "manifest.json"));
        json["shards"][1]["bytes"] = "many";
        write_file(d / "manifest.json", json.dump());
      },
      "manifest.json", "manifest field 'shards[1].bytes' is missing or not an unsigned integer");
}

TEST_F(CheckpointStoreTest, RefusesAForgedShardWhoseCountersCannotBeAStages) {
  expect_detected(
      checkpoints(),
      [](const fs::path& d) {
        stage_state forged = state_for(20, 1);
        forged.keys_since_step = -5;
        forge_shard(d, 1, serialize_stage_state(forged));
      },
      "stage-1.shard", "the shard's keys_since_step is negative (-5)");
}

TEST_F(CheckpointStoreTest, RefusesAnotherStagesBytesUnderAStagesName) {
  expect_detected(
      checkpoints(),
      [](const fs::path& d) { forge_shard(d, 1, serialize_stage_state(state_for(20, 0))); },
      "stage-1.shard", "holds the state of stage 0 of 2, where the manifest lists stage 1 of 2");
}

TEST_F(CheckpointStoreTest, RefusesAShardThatIsNotAStageState) {
  expect_detected(
      checkpoints(), [](const fs::path& d) { forge_shard(d, 0, std::string(64, 'x')); },
      "stage-0.shard", "not a troupe stage shard (bad magic)");
}

TEST_F(CheckpointStoreTest, RefusesAManifestNestedAMillionLevelsDeep) {
  // Copying or printing such a value recurses once per level: it would overflow the stack.
  expect_detected(
      checkpoints(),
      [](const fs::path& d) {
        write_file(d / "manifest.json", std::string(1000000, '[') + std::string(1000000, ']'));
      },
      "manifest.json", "nested deeper than 64 levels");
}

TEST_F(CheckpointStoreTest, RefusesAFifoWhereAShardOrTheManifestBelongs) {
  // Opened to read, a FIFO with no writer blocks for ever; the store must not wait on it.
  for (const std::string file : {"stage-1.shard", "manifest.json"}) {
    const fs::path root = root_ / file;
    expect_detected(
        root.string(),
        [&](const fs::path& d) {
          fs::remove(d / file);
          ASSERT_EQ(::mkfifo((d / file).c_str(), 0600), 0);
        },
        file, "a FIFO, not a regular file");
  }
}

TEST_F(CheckpointStoreTest, DetectsACheckpointOfAnotherJob) {
  checkpoint_store store(checkpoints(), 0);
  commit_step(store, 10);
  commit_step(store, 20, "fedcba9876543210");
  std::string error;
  EXPECT_FALSE(load_checkpoint(step_directory(20), job_hash, &error));
  EXPECT_EQ(error, step_directory(20) +
                       "/manifest.json: written by a job with config hash fedcba9876543210, "
                       "this job's is " +
                       job_hash);
  std::vector<std::string> problems;
  auto latest = store.load_latest(job_hash, &problems);
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->manifest.step, 10);
  EXPECT_EQ(problems, std::vector<std::string>{error});
  std::string ignored;
  EXPECT_TRUE(load_checkpoint(step_directory(20), "", &ignored)) << "an empty hash checks none";
}

TEST_F(CheckpointStoreTest, LoadLatestGivesNothingWhenNothingVerifies) {
  checkpoint_store store(checkpoints(), 0);
  commit_step(store, 10);
  fs::resize_file(fs::path(step_directory(10)) / "stage-0.shard", 3);
  std::vector<std::string> problems;
  EXPECT_FALSE(store.load_latest(job_hash, &problems));
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("step-10/stage-0.shard"), std::string::npos);
  EXPECT_FALSE(checkpoint_store((root_ / "absent").string(), 0).load_latest(job_hash, &problems));
}

/// Where a commit of step 20 (two shards, then the manifest, then latest) can be cut short.
enum class crash_point { after_shard_0, after_shard_1, before_manifest_rename };

/// Commits step 20 through a file system that crashes, as a kill or a power cut would, at
/// `point`; returns whether it did (the commit failing there).
bool crashed_during_commit(const std::string& root, crash_point point) {
  faulty_file_system files(posix_files());
  switch (point) {
    case crash_point::after_shard_0:
      files.crash_at_write(2);
      break;
    case crash_point::after_shard_1:
      files.crash_at_write(3);
      break;
    case crash_point::before_manifest_rename:
      files.crash_at_write(3, true);
      break;
  }
  checkpoint_store store(root, 0, files);
  std::string error;
  return !store.commit(manifest_for(20), shards_for(20), &error) && files.crashed();
}

void expect_crash_leaves_step_10(const std::string& root, crash_point point) {
  checkpoint_store store(root, 0);
  commit_step(store, 10);
  ASSERT_TRUE(crashed_during_commit(root, point));
  EXPECT_TRUE(fs::exists(fs::path(root) / "step-20"));  // the child got that far
  EXPECT_EQ(names_of(store.committed()), std::vector<std::string>{"step-10"});
  std::vector<std::string> problems;
  auto latest = store.load_latest(job_hash, &problems);
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->manifest.step, 10);
  EXPECT_EQ(problems, std::vector<std::string>{(fs::path(root) / "step-20/manifest.json").string() +
                                               ": missing (not a committed checkpoint)"});
  EXPECT_EQ(read_file(fs::path(root) / "latest"), "step-10\n");
}

TEST_F(CheckpointStoreTest, CrashAfterTheFirstShardLeavesThePreviousCheckpoint) {
  expect_crash_leaves_step_10(checkpoints(), crash_point::after_shard_0);
  EXPECT_FALSE(fs::exists(fs::path(step_directory(20)) / "stage-1.shard"));
}

TEST_F(CheckpointStoreTest, CrashBeforeTheManifestRenameLeavesThePreviousCheckpoint) {
  expect_crash_leaves_step_10(checkpoints(), crash_point::before_manifest_rename);
  EXPECT_TRUE(fs::exists(fs::path(step_directory(20)) / "manifest.json.tmp"));
  EXPECT_FALSE(fs::exists(fs::path(step_directory(20)) / "manifest.json"));
}

TEST_F(CheckpointStoreTest, CommitAfterACrashReplacesTheLeftover) {
  checkpoint_store store(checkpoints(), 0);
  commit_step(store, 10);
  ASSERT_TRUE(crashed_during_commit(checkpoints(), crash_point::after_shard_1));
  commit_step(store, 20);
  EXPECT_FALSE(fs::exists(fs::path(step_directory(20)) / "manifest.json.tmp"));
  std::string error;
  auto loaded = load_checkpoint(step_directory(20), job_hash, &error);
  ASSERT_TRUE(loaded) << error;
  EXPECT_EQ(loaded->shards, shards_for(20));
}

TEST_F(CheckpointStoreTest, AFailedWriteFailsTheCommitNamingItAndKeepsThePreviousCheckpoint) {
  checkpoint_store store(checkpoints(), 0);
  commit_step(store, 10);
  for (int write : {1, 2, 3, 4}) {  // each shard, the manifest, the latest pointer
    faulty_file_system files(posix_files());
    files.fail_at_write(write);
    checkpoint_store failing(checkpoints(), 0, files);
    std::string error;
    EXPECT_FALSE(failing.commit(manifest_for(20), shards_for(20), &error)) << write;
    EXPECT_NE(error.find("no space left on device"), std::string::npos) << error;
    std::vector<std::string> problems;
    auto latest = store.load_latest(job_hash, &problems);
    ASSERT_TRUE(latest) << write;
    // Only a failure of the last write, the pointer, leaves step 20 committed: the manifest
    // is what commits it, and load_latest goes by the step directories, newest first.
    EXPECT_EQ(latest->manifest.step, write == 4 ? 20 : 10) << write;
    EXPECT_EQ(read_file(fs::path(checkpoints()) / "latest"), "step-10\n") << write;
  }
}

TEST_F(CheckpointStoreTest, ResolveResumeAcceptsAStepDirectoryACheckpointsDirectoryAndARun) {
  checkpoint_store store(checkpoints(), 0);
  commit_step(store, 10);
  commit_step(store, 20);
  std::vector<std::string> problems;
  std::string error;
  auto step = resolve_resume(step_directory(10) + "/", job_hash, &problems, &error);
  ASSERT_TRUE(step) << error;
  EXPECT_EQ(step->manifest.step, 10);
  auto latest = resolve_resume(checkpoints(), job_hash, &problems, &error);
  ASSERT_TRUE(latest) << error;
  EXPECT_EQ(latest->manifest.step, 20);
  auto run = resolve_resume(root_.string(), job_hash, &problems, &error);
  ASSERT_TRUE(run) << error;
  EXPECT_EQ(run->manifest.step, 20);
  EXPECT_TRUE(problems.empty());
}

TEST_F(CheckpointStoreTest, ResolveResumeFallsBackFromABrokenStepToAnOlderOne) {
  checkpoint_store store(checkpoints(), 0);
  for (int64_t step : {10, 20, 30}) commit_step(store, step);
  fs::resize_file(fs::path(step_directory(20)) / "stage-1.shard", 5);
  std::vector<std::string> problems;
  std::string error;
  auto loaded = resolve_resume(step_directory(20), job_hash, &problems, &error);
  ASSERT_TRUE(loaded) << error;
  EXPECT_EQ(loaded->manifest.step, 10);  // older than the named one, never the newer step 30
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("step-20/stage-1.shard"), std::string::npos);
}

TEST_F(CheckpointStoreTest, ResolveResumeExplainsWhatItCouldNotLoad) {
  std::vector<std::string> problems;
  std::string error;
  const std::string absent = (root_ / "nowhere").string();
  EXPECT_FALSE(resolve_resume(absent, job_hash, &problems, &error));
  EXPECT_EQ(error, "no checkpoint at " + absent);

  checkpoint_store store(checkpoints(), 0);
  commit_step(store, 10, "fedcba9876543210");
  EXPECT_FALSE(resolve_resume(root_.string(), job_hash, &problems, &error));
  EXPECT_NE(error.find("no checkpoint in " + checkpoints() + " loads"), std::string::npos) << error;
  EXPECT_NE(error.find("step-10/manifest.json: written by a job with config hash"),
            std::string::npos)
      << error;
  EXPECT_EQ(problems.size(), 1u);
}

}  // namespace
}  // namespace troupe::actors
