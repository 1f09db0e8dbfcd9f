#include "actors/config/job_warnings.h"

#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/config/job_checks.h"
#include "actors/config/job_file.h"
#include "tests/actors/config/job_file_test_support.h"

namespace troupe::actors {
namespace {

using namespace job_file_testing;

/// Eight blocks, so that up to eight stages fit.
const std::string kEightBlocks =
    "[model]\ninput_shape = [8]\nlayers = [{ type = \"linear\", out = 8 }, { type = \"relu\" }, "
    "{ type = \"linear\", out = 8 }, { type = \"relu\" }, { type = \"linear\", out = 8 }, "
    "{ type = \"relu\" }, { type = \"linear\", out = 8 }, { type = \"tanh\" }]\n"
    "[data]\ndataset = \"synthetic\"\n";

/// The warnings of a job that must be accepted.
std::vector<std::string> warnings_of(const std::string& text,
                                     const std::vector<std::string>& overrides = {}) {
  job_error error;
  std::vector<std::string> warnings;
  EXPECT_TRUE(parse_job(text, "job.toml", overrides, &error, &warnings)) << error.message;
  return warnings;
}

/// The micro-batches a job resolves to.
int micro_batches_of(const std::vector<std::string>& overrides) {
  std::optional<job_config> config = parse(kEightBlocks, overrides);
  return config ? config->parallelism.micro_batches : -1;
}

// The micro_batches default -----------------------------------------------------------------

TEST(JobWarningsTest, ASyncPipelineWithoutMicroBatchesGetsOnePerStage) {
  EXPECT_EQ(micro_batches_of({"parallelism.stages=4"}), 4);
  EXPECT_EQ(micro_batches_of({"parallelism.stages=2"}), 2);
  std::optional<job_config> config = parse(kEightBlocks, {"parallelism.stages=4"});
  ASSERT_TRUE(config);
  // config.json shows the resolved value, and MUI follows it.
  EXPECT_EQ(to_json(*config)["parallelism"]["micro_batches"], 4);
  EXPECT_EQ(config->parallelism.min_update_interval, 4);
  EXPECT_TRUE(warnings_of(kEightBlocks, {"parallelism.stages=4"}).empty());
}

TEST(JobWarningsTest, TheDefaultIsOneMicroBatchForOneStageAndInAsyncMode) {
  EXPECT_EQ(micro_batches_of({}), 1);
  EXPECT_EQ(micro_batches_of({"parallelism.stages=4", "parallelism.mode=async"}), 1);
}

TEST(JobWarningsTest, AnExplicitMicroBatchCountIsKept) {
  EXPECT_EQ(micro_batches_of({"parallelism.stages=4", "parallelism.micro_batches=8"}), 8);
  EXPECT_EQ(micro_batches_of({"parallelism.stages=4", "parallelism.micro_batches=1"}), 1);
}

TEST(JobWarningsTest, TheDefaultDividesTheBatchOfEveryReplica) {
  // The smallest divisor of batch_size / replicas from stages up to twice the stages ...
  EXPECT_EQ(micro_batches_of({"parallelism.stages=3"}), 4);  // batch 64
  EXPECT_EQ(micro_batches_of({"parallelism.stages=5", "training.batch_size=48"}), 6);
  EXPECT_EQ(micro_batches_of(
                {"parallelism.stages=4", "training.batch_size=36", "parallelism.replicas=3"}),
            4);
  EXPECT_EQ(micro_batches_of(
                {"parallelism.stages=4", "training.batch_size=40", "parallelism.replicas=2"}),
            4);
  EXPECT_EQ(micro_batches_of(
                {"parallelism.stages=3", "training.batch_size=40", "parallelism.replicas=2"}),
            4);
  // ... else the largest below the stages: 26 = 2 × 13 on 4 stages, and a batch of 2.
  EXPECT_EQ(micro_batches_of({"parallelism.stages=4", "training.batch_size=26"}), 2);
  EXPECT_EQ(micro_batches_of({"parallelism.stages=4", "training.batch_size=2"}), 2);
  EXPECT_EQ(micro_batches_of({"parallelism.stages=7", "training.batch_size=17"}), 1);
}

TEST(JobWarningsTest, TheDefaultFitsTheInterleavedSchedule) {
  std::optional<job_config> config = parse(
      kEightBlocks,
      {"parallelism.stages=8", "parallelism.schedule=interleaved", "parallelism.virtual_stages=2"});
  ASSERT_TRUE(config);
  EXPECT_EQ(config->parallelism.micro_batches, 8);
  EXPECT_EQ(config->parallelism.micro_batches % (8 / 2), 0);  // Megatron-LM's order applies
}

TEST(JobWarningsTest, ARefusedJobIsStillRefusedForItsOwnReason) {
  // Replicas that do not divide the batch, and more stages than blocks.
  EXPECT_NE(error_of(kEightBlocks, {"parallelism.stages=2", "parallelism.replicas=3"})
                .find("parallelism.replicas (3) times parallelism.micro_batches (1)"),
            std::string::npos);
  EXPECT_NE(error_of(kEightBlocks, {"parallelism.stages=9"}).find("parallelism.stages (9)"),
            std::string::npos);
}

TEST(JobWarningsTest, AnExplicitSingleMicroBatchInASyncPipelineWarnsThatItsStagesTakeTurns) {
  const std::vector<std::string> warnings =
      warnings_of(kEightBlocks, {"parallelism.stages=4", "parallelism.micro_batches=1"});
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "job.toml: parallelism.micro_batches = 1 runs the 4 stages one at a time in sync "
            "mode: each batch is one key, which visits them in turn (unset, micro_batches would "
            "be 4)");
  EXPECT_TRUE(warnings_of(kEightBlocks, {"parallelism.micro_batches=1"}).empty());
  EXPECT_TRUE(warnings_of(kEightBlocks, {"parallelism.stages=4", "parallelism.mode=async",
                                         "parallelism.micro_batches=1"})
                  .empty());
}

// Keys that do nothing in the job's mode ----------------------------------------------------

struct idle_case {
  std::vector<std::string> overrides;
  std::string key;     ///< the key the one warning must name
  std::string reason;  ///< and a part of its reason
};

const std::vector<idle_case> kIdleCases = {
    {{"parallelism.stages=2", "parallelism.min_update_interval=2"},
     "parallelism.min_update_interval",
     "in sync mode"},
    {{"parallelism.stages=2", "parallelism.max_active_keys=3"},
     "parallelism.max_active_keys",
     "in sync mode"},
    {{"parallelism.stages=2", "parallelism.max_staleness=1"},
     "parallelism.max_staleness",
     "in sync mode"},
    {{"parallelism.stages=2", "parallelism.weight_stashing=true"},
     "parallelism.weight_stashing",
     "in sync mode"},
    {{"parallelism.stages=2", "parallelism.staleness_correction=predict", "training.momentum=0.9"},
     "parallelism.staleness_correction",
     "in sync mode"},
    {{"parallelism.stages=2", "parallelism.mode=async", "parallelism.correction_warmup_steps=50"},
     "parallelism.correction_warmup_steps",
     "without parallelism.staleness_correction = \"pipemare\""},
    {{"parallelism.stages=2", "parallelism.mode=async", "parallelism.schedule=1f1b"},
     "parallelism.schedule",
     "in async mode"},
    {{"parallelism.stages=4", "parallelism.schedule=1f1b", "parallelism.virtual_stages=2"},
     "parallelism.virtual_stages",
     "outside parallelism.schedule = \"interleaved\""},
    {{"parallelism.mode=async", "parallelism.replica_sync_interval=4"},
     "parallelism.replica_sync_interval",
     "with one replica"},
    {{"parallelism.replicas=2", "parallelism.replica_staleness=2"},
     "parallelism.replica_staleness",
     "in sync mode"},
    {{"parallelism.collective=shared_memory"}, "parallelism.collective", "with one replica"},
    {{"parallelism.partition=uniform"}, "parallelism.partition", "with one stage"},
    {{"parallelism.recompute=true"}, "parallelism.recompute", "without transformer_block"},
    {{"training.optimizer=adam", "training.momentum=0.9"}, "training.momentum", "\"adam\""},
    {{"training.beta2=0.99"}, "training.beta2", "with training.optimizer = \"sgd\""},
    {{"training.lr_decay_epochs=2"}, "training.lr_decay_epochs", "lr_schedule = \"step\""},
    {{"data.context=64"}, "data.context", "with data.dataset = \"synthetic\""},
    {{"data.dataset=fashion-mnist", "data.classes=4"}, "data.classes", "\"fashion-mnist\""},
    {{"data.path=/tmp/nowhere"}, "data.path", "with data.dataset = \"synthetic\""},
};

TEST(JobWarningsTest, AKeySetThatDoesNothingInTheJobsModeWarnsInOneLineNamingIt) {
  for (const idle_case& c : kIdleCases) {
    const std::vector<std::string> warnings = warnings_of(kEightBlocks, c.overrides);
    ASSERT_EQ(warnings.size(), 1u) << c.key;
    const std::string& warning = warnings[0];
    EXPECT_EQ(warning.rfind("job.toml: " + c.key + " does nothing ", 0), 0u) << warning;
    EXPECT_NE(warning.find(c.reason), std::string::npos) << warning;
    EXPECT_EQ(warning.find('\n'), std::string::npos) << warning;
  }
}

TEST(JobWarningsTest, TheSameKeysWhereTheyActDoNotWarn) {
  const std::vector<std::vector<std::string>> acting = {
      {"parallelism.stages=2", "parallelism.mode=async", "parallelism.min_update_interval=2",
       "parallelism.max_active_keys=3", "parallelism.max_staleness=1",
       "parallelism.weight_stashing=true"},
      {"parallelism.stages=2", "parallelism.mode=async",
       "parallelism.staleness_correction=pipemare", "parallelism.correction_warmup_steps=50"},
      {"parallelism.stages=4", "parallelism.schedule=interleaved", "parallelism.virtual_stages=2"},
      {"parallelism.mode=async", "parallelism.replicas=2", "parallelism.replica_sync_interval=4",
       "parallelism.replica_staleness=2", "parallelism.collective=shared_memory"},
      {"parallelism.stages=2", "parallelism.partition=uniform"},
      {"training.optimizer=adam", "training.beta2=0.99"},
      {"training.lr_schedule=step", "training.lr_decay_epochs=2", "training.lr_decay=0.5"},
      {"data.classes=4", "data.synthetic_train=512"},
  };
  for (const std::vector<std::string>& overrides : acting) {
    const std::vector<std::string> warnings = warnings_of(kEightBlocks, overrides);
    EXPECT_TRUE(warnings.empty()) << overrides.front() << ": " << warnings.front();
  }
}

TEST(JobWarningsTest, KeysLeftAtTheirDefaultOrSetToItNeverWarn) {
  EXPECT_TRUE(warnings_of(kMinimal).empty());
  for (const std::string& mode : {"sync", "async"}) {
    EXPECT_TRUE(warnings_of(kEightBlocks, {"parallelism.stages=4", "parallelism.mode=" + mode,
                                           "parallelism.replicas=2"})
                    .empty())
        << mode;
  }
  // Written out at their defaults, the keys that would warn otherwise do nothing in any mode.
  EXPECT_TRUE(warnings_of(kEightBlocks + "[parallelism]\nstages = 2\nmax_staleness = -1\n"
                                         "weight_stashing = false\nstaleness_correction = "
                                         "\"none\"\ncollective = \"ring\"\n[training]\n"
                                         "beta1 = 0.9\nlr_decay = 0.1\n")
                  .empty());
}

TEST(JobWarningsTest, TheExampleJobsFollowTheirOwnAdvice) {
  int jobs = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(TROUPE_SOURCE_DIR "/apps/examples")) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".toml" || name.rfind("cluster_", 0) == 0) continue;
    job_error error;
    std::vector<std::string> warnings;
    ASSERT_TRUE(load_job_file(entry.path().string(), {}, &error, &warnings)) << error.message;
    EXPECT_TRUE(warnings.empty()) << warnings.front();
    ++jobs;
  }
  EXPECT_GE(jobs, 8);
}

// A run that recovers without checkpoints ---------------------------------------------------

TEST(JobWarningsTest, RecoveryWithoutACheckpointIntervalWarnsThatItRestartsFromStepZero) {
  std::optional<job_config> config = parse(kEightBlocks);
  ASSERT_TRUE(config);
  const std::optional<std::string> warning = recovery_warning(*config);
  ASSERT_TRUE(warning);
  EXPECT_NE(warning->find("checkpoint.max_restarts = 3"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("from step 0"), std::string::npos) << *warning;
  for (const std::string& set :
       {"checkpoint.interval_steps=100", "checkpoint.interval_s=60", "checkpoint.max_restarts=0"}) {
    config = parse(kEightBlocks, {set});
    ASSERT_TRUE(config);
    EXPECT_FALSE(recovery_warning(*config)) << set;
  }
}

}  // namespace
}  // namespace troupe::actors
