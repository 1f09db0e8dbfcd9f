// Data-parallel replicas from the command line: bad settings are one line with status 2, a rank
// started for another number of replicas is refused, summary.json names each stage actor's
// stage and replica, and a checkpoint resumes under another number of replicas.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/cli_helpers.h"

namespace {

namespace fs = std::filesystem;
using namespace troupe::testing;

class ReplicaCliTest : public troupe_command_test {
 protected:
  nlohmann::json summary(const std::string& name) {
    return nlohmann::json::parse(read_file(directory_ / name / "summary.json"));
  }
};

TEST_F(ReplicaCliTest, BadReplicaSettingsAreOneLineWithStatusTwo) {
  const std::string job = tiny_job().string();  // batch 32
  const std::string out = " --out " + (directory_ / "bad").string();
  expect_one_line(troupe("train " + job + " --set parallelism.replicas=3" + out),
                  "parallelism.replicas (3) times parallelism.micro_batches (1) must divide "
                  "training.batch_size (32)");
  expect_one_line(
      troupe("train " + job +
             " --set parallelism.replicas=2 --set parallelism.stages=2 --workers 3" + out),
      "3 workers do not divide parallelism.replicas (2) x parallelism.stages (2)");
  expect_one_line(troupe("train " + job +
                         " --set parallelism.replicas=2 --set parallelism.mode='\"async\"' --set "
                         "parallelism.replica_staleness=0" +
                         out),
                  "parallelism.replica_staleness must be -1 (unbounded) or >= 1");
  expect_one_line(troupe("train " + job +
                         " --set parallelism.replicas=2 --set "
                         "parallelism.collective='\"shared_memory\"' --workers 2" +
                         out),
                  "parallelism.collective = \"shared_memory\" sums the replicas in one process");
  expect_one_line(
      troupe("train " + job +
             " --set parallelism.replicas=2 --set parallelism.collective='\"nccl\"'" + out),
      "parallelism.collective = \"nccl\" needs every stage on a CUDA device");
}

TEST_F(ReplicaCliTest, SyncReplicasInWorkerProcessesEqualOnePipelineAndNameTheirStages) {
  const std::string job = tiny_job().string() + " --quiet --set parallelism.stages=2";
  ASSERT_EQ(troupe("train " + job + " --set parallelism.micro_batches=2 --out " +
                   (directory_ / "one").string())
                .status,
            0);
  // Each replica one key of 16 samples: the keys of the one pipeline.
  const run_result many = troupe("train " + job +
                                 " --set parallelism.replicas=2 --set parallelism.micro_batches=1"
                                 " --workers 4 --out " +
                                 (directory_ / "many").string());
  ASSERT_EQ(many.status, 0) << many.errors;
  const double one = summary("one")["final_test_loss"].get<double>();
  const double replicated = summary("many")["final_test_loss"].get<double>();
  EXPECT_NEAR(replicated, one, 1e-5 * std::abs(one));
  const nlohmann::json stages = summary("many")["stages"];
  ASSERT_EQ(stages.size(), 4u);
  for (int actor = 0; actor < 4; ++actor) {
    EXPECT_EQ(stages[actor]["stage"], actor % 2);
    EXPECT_EQ(stages[actor]["replica"], actor / 2);
    EXPECT_EQ(stages[actor]["optimizer_steps"], 32);
  }
}

TEST_F(ReplicaCliTest, AsyncReplicasReportHowFarEachStageRanAhead) {
  const run_result result =
      troupe("train " + tiny_job().string() +
             " --quiet --set parallelism.stages=2 --set parallelism.replicas=2"
             " --set parallelism.mode='\"async\"' --set "
             "parallelism.replica_staleness=1 --out " +
             (directory_ / "async").string());
  ASSERT_EQ(result.status, 0) << result.errors;
  const nlohmann::json stages = summary("async")["stages"];
  for (const nlohmann::json& stage : stages) {
    const auto histogram = stage["replica_staleness_histogram"].get<std::vector<int64_t>>();
    ASSERT_FALSE(histogram.empty());
    EXPECT_LE(histogram.size(), 2u);  // never more than one version ahead
    int64_t steps = 0;
    for (int64_t count : histogram) steps += count;
    EXPECT_EQ(steps, stage["optimizer_steps"].get<int64_t>());
  }
}

TEST_F(ReplicaCliTest, ACheckpointResumesUnderAnotherNumberOfReplicas) {
  const std::string job =
      tiny_job().string() + " --quiet --set parallelism.stages=2 --set checkpoint.interval_steps=8";
  const std::string out = (directory_ / "run").string();
  ASSERT_EQ(troupe("train " + job +
                   " --set parallelism.replicas=2 --set training.max_steps=16"
                   " --out " +
                   out)
                .status,
            0);
  const run_result resumed = troupe("train " + job + " --resume --out " + out);
  ASSERT_EQ(resumed.status, 0) << resumed.errors;
  EXPECT_EQ(summary("run")["steps"], 32);
  // Both halves ran the same job as one uninterrupted run at the same global batch.
  ASSERT_EQ(troupe("train " + job + " --out " + (directory_ / "straight").string()).status, 0);
  EXPECT_NEAR(summary("run")["final_test_loss"].get<double>(),
              summary("straight")["final_test_loss"].get<double>(), 1e-4);
}

TEST_F(ReplicaCliTest, ARankStartedForAnotherNumberOfReplicasIsRefused) {
  const std::string job = tiny_job().string() + " --quiet --set parallelism.replicas=2";
  const std::string port = std::to_string(33000 + getpid() % 1000);
  const auto rank = [&](int index, const std::string& extra) {
    return "env RANK=" + std::to_string(index) +
           " WORLD_SIZE=3 LOCAL_RANK=" + std::to_string(index) +
           " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " " + TROUPE_BINARY + " launch " + job +
           extra;
  };
  const fs::path done0 = directory_ / "rank0.status", done1 = directory_ / "rank1.status";
  // Each rank's exit status lands in its file whole (written aside, then renamed).
  const auto status_to = [](const fs::path& file) {
    return " >/dev/null 2>&1; echo $? > " + file.string() + ".part; mv " + file.string() +
           ".part " + file.string();
  };
  const std::string background = "(" + rank(0, " --out " + (directory_ / "launched").string()) +
                                 status_to(done0) + ") & (" + rank(1, "") + status_to(done1) +
                                 ") &";
  ASSERT_EQ(std::system(("bash -c '" + background + "'").c_str()), 0);
  // A third rank started for one replica: refused by the coordinator, status 2.
  const fs::path errors = directory_ / "stranger.txt";
  const int raw = std::system(
      (rank(2, " --set parallelism.replicas=1") + " >/dev/null 2>" + errors.string()).c_str());
  EXPECT_EQ(WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, 2);
  EXPECT_NE(read_file(errors).find("started for another job"), std::string::npos)
      << read_file(errors);
  // The job's own third rank completes the run.
  EXPECT_EQ(std::system((rank(2, "") + " >/dev/null 2>&1").c_str()), 0);
  ASSERT_TRUE(
      eventually([&] { return fs::exists(done0) && fs::exists(done1); }, std::chrono::seconds(60)));
  EXPECT_EQ(read_file(done0), "0\n");
  EXPECT_EQ(read_file(done1), "0\n");
  EXPECT_EQ(summary("launched")["steps"], 32);
}

TEST_F(ReplicaCliTest, ALostWorkerOfAReplicaIsRecoveredToTheSameModel) {
  // Sync replicas recover exactly: the run that lost a worker ends where the one that did not
  // ends.
  const fs::path job = write("long.toml", mlp_model("relu", "tanh") + synthetic_data(2048, 64) + R"(
[parallelism]
stages = 2
replicas = 2
micro_batches = 2
[training]
batch_size = 16
epochs = 3
[checkpoint]
interval_steps = 40
[metrics]
log_interval = 10
)");
  const std::vector<std::string> settings = {"--quiet", "--workers", "4", "--heartbeat-timeout",
                                             "1"};
  std::string straight_command =
      "train " + job.string() + " --out " + (directory_ / "straight").string();
  for (const std::string& setting : settings) straight_command += " " + setting;
  ASSERT_EQ(troupe(straight_command).status, 0);
  const fs::path run = directory_ / "run";
  std::vector<std::string> arguments = {"train", job.string(), "--out", run.string()};
  arguments.insert(arguments.end(), settings.begin(), settings.end());
  const pid_t pid = spawn_troupe(arguments, directory_ / "errors.txt");
  ASSERT_TRUE(wait_until([&] { return read_file(run / "metrics.jsonl").size() > 2000; }, 60));
  std::vector<pid_t> children;
  std::istringstream list(
      read_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children"));
  for (pid_t child; list >> child;) children.push_back(child);
  ASSERT_FALSE(children.empty());
  kill(children.back(), SIGKILL);  // the worker of replica 1's last stage
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << read_file(directory_ / "errors.txt");
  EXPECT_NE(read_file(run / "metrics.jsonl").find("\"worker_lost\""), std::string::npos);
  EXPECT_EQ(summary("run")["final_test_loss"], summary("straight")["final_test_loss"]);
}

}  // namespace
