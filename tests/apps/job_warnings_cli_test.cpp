// `troupe train` with the defaults that depend on the job and the warnings of
// actors/config/job_warnings.h: a sync pipeline without micro_batches trains with one key per
// stage, and a job's warnings are printed once, before training, and only for keys it sets.

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/cli_helpers.h"

namespace {

namespace fs = std::filesystem;

using namespace troupe::testing;

class JobWarningsCliTest : public troupe_command_test {
 protected:
  /// The 8-16-16-4 MLP (5 blocks) in a sync pipeline of 4 stages, micro_batches unset: one
  /// epoch of 16 steps.
  fs::path four_stage_job(const std::string& extra = "") {
    return write("four.toml", mlp_model("relu", "tanh") + synthetic_data(512, 128) + R"(
[parallelism]
stages = 4
partition = "uniform"
)" + extra + R"(
[training]
batch_size = 32
epochs = 1
lr = 0.1
)");
  }

  /// How many lines of `text` contain `needle`.
  static int lines_with(const std::string& text, const std::string& needle) {
    std::istringstream lines(text);
    int count = 0;
    for (std::string line; std::getline(lines, line);) count += line.find(needle) != line.npos;
    return count;
  }
};

TEST_F(JobWarningsCliTest, ASyncPipelineWithoutMicroBatchesTrainsWithOneKeyPerStage) {
  const fs::path out = directory_ / "run";
  const run_result result = troupe("train " + four_stage_job().string() +
                                   " --set metrics.trace=true --quiet --out " + out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  EXPECT_EQ(lines_with(result.errors, "warning"), 0) << result.errors;
  const auto config = nlohmann::json::parse(read_file(out / "config.json"));
  EXPECT_EQ(config["parallelism"]["micro_batches"], 4);
  const auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
  EXPECT_EQ(summary["steps"], 16);
  ASSERT_EQ(summary["stages"].size(), 4u);
  for (const auto& stage : summary["stages"]) EXPECT_EQ(stage["optimizer_steps"], 16);
  // Four keys of 8 samples per step go through the first stages: 16 steps × 4 forwards.
  const auto trace = nlohmann::json::parse(read_file(out / "trace.json"));
  std::map<int, int> forwards;  // by Chrome thread id: stage + 1
  for (const auto& event : trace["traceEvents"]) {
    if (event["name"] == "forward") ++forwards[event["tid"].get<int>()];
  }
  EXPECT_EQ(forwards, (std::map<int, int>{{1, 64}, {2, 64}, {3, 64}}));
}

TEST_F(JobWarningsCliTest, AKeyThatDoesNothingIsNamedOnceAndTheRunGoesOn) {
  const fs::path job = four_stage_job("min_update_interval = 2\nmicro_batches = 1\n");
  const run_result result =
      troupe("train " + job.string() + " --quiet --out " + (directory_ / "run").string());
  ASSERT_EQ(result.status, 0) << result.errors;
  EXPECT_EQ(lines_with(result.errors, "troupe: warning: " + job.string() +
                                          ": parallelism.min_update_interval does nothing in "
                                          "sync mode"),
            1)
      << result.errors;
  EXPECT_EQ(lines_with(result.errors, "troupe: warning: " + job.string() +
                                          ": parallelism.micro_batches = 1 runs the 4 stages one "
                                          "at a time"),
            1)
      << result.errors;
  EXPECT_EQ(lines_with(result.errors, "warning"), 2) << result.errors;
  // An override is a key set too.
  const run_result overridden =
      troupe("train " + four_stage_job().string() + " --set parallelism.max_staleness=1 --quiet" +
             " --out " + (directory_ / "overridden").string());
  ASSERT_EQ(overridden.status, 0) << overridden.errors;
  EXPECT_EQ(lines_with(overridden.errors, "parallelism.max_staleness does nothing in sync mode"), 1)
      << overridden.errors;
}

TEST_F(JobWarningsCliTest, ARefusedJobPrintsItsErrorAlone) {
  expect_one_line(troupe("train " + four_stage_job("min_update_interval = 2\n").string() +
                         " --workers 5 --out " + (directory_ / "run").string()),
                  "5 workers for 4 stages");
}

TEST_F(JobWarningsCliTest, OnlyARunInWorkerProcessesWarnsThatRecoveryStartsOver) {
  const std::string job = four_stage_job().string() + " --quiet";
  const std::string warning = "every recovery trains from step 0 again";
  const run_result workers =
      troupe("train " + job + " --workers 2 --out " + (directory_ / "workers").string());
  ASSERT_EQ(workers.status, 0) << workers.errors;
  EXPECT_EQ(lines_with(workers.errors, "checkpoint.max_restarts = 3"), 1) << workers.errors;
  EXPECT_EQ(lines_with(workers.errors, warning), 1) << workers.errors;
  const run_result checkpointed =
      troupe("train " + job + " --workers 2 --set checkpoint.interval_steps=8 --out " +
             (directory_ / "checkpointed").string());
  ASSERT_EQ(checkpointed.status, 0) << checkpointed.errors;
  EXPECT_EQ(lines_with(checkpointed.errors, warning), 0) << checkpointed.errors;
  // One process: nothing recovers, so the default says nothing.
  const run_result alone = troupe("train " + job + " --out " + (directory_ / "alone").string());
  ASSERT_EQ(alone.status, 0) << alone.errors;
  EXPECT_EQ(lines_with(alone.errors, "warning"), 0) << alone.errors;
}

}  // namespace
