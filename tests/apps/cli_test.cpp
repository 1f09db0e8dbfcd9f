// The `troupe` binary as a user meets it: bad input gives one clear line and exit status 2;
// a small run writes config.json, metrics.jsonl and summary.json.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/support/cli_helpers.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;

using namespace troupe::testing;

class CliTest : public troupe_command_test {};

TEST_F(CliTest, ADivergingRunStopsWithStatusOneNamingTheStep) {
  const fs::path job = write("relu.toml", mlp_model("relu", "relu") + synthetic_data(512, 128) + R"(
[parallelism]
stages = 2
[training]
batch_size = 32
epochs = 2
lr = 1e30
lr_schedule = "constant"
)");
  for (const std::string workers : {"", " --workers 2"}) {
    const fs::path out = directory_ / ("diverged" + std::to_string(workers.size()));
    run_result result =
        troupe("train " + job.string() + " --quiet --out " + out.string() + workers);
    EXPECT_EQ(result.status, 1) << workers << "\n" << result.errors;
    EXPECT_NE(result.errors.find("training diverged: the loss of step "), std::string::npos)
        << workers << "\n"
        << result.errors;
    EXPECT_FALSE(fs::exists(out / "summary.json")) << workers;
  }
}

TEST_F(CliTest, TrainsAndWritesOutputs) {
  const fs::path out = directory_ / "run";
  run_result result = troupe("train " + tiny_job().string() + " --out " + out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  auto config = nlohmann::json::parse(read_file(out / "config.json"));
  EXPECT_EQ(config["training"]["batch_size"], 32);
  for (const char* section :
       {"model", "data", "parallelism", "training", "checkpoint", "metrics"}) {
    EXPECT_TRUE(config.contains(section)) << section;
  }
  auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
  for (const char* key :
       {"final_test_accuracy", "epochs", "steps", "samples_per_s", "wall_s", "time_to_target_s"}) {
    EXPECT_TRUE(summary.contains(key)) << key;
  }
  EXPECT_EQ(summary["steps"], 32);
  EXPECT_EQ(summary["epochs"], 2);
  EXPECT_GT(summary["final_test_accuracy"].get<double>(), 0.5);
  EXPECT_TRUE(summary["time_to_target_s"].is_number());
  // The step of the first evaluation at or above the target: an epoch's end, 16 steps apiece.
  ASSERT_TRUE(summary["steps_to_target"].is_number_integer()) << summary.dump();
  EXPECT_EQ(summary["steps_to_target"].get<int64_t>() % 16, 0) << summary.dump();
  EXPECT_GT(summary["steps_to_target"].get<int64_t>(), 0) << summary.dump();
  std::istringstream lines(read_file(out / "metrics.jsonl"));
  std::string line;
  int records = 0, evaluations = 0;
  while (std::getline(lines, line)) {
    auto record = nlohmann::json::parse(line);
    for (const char* key : {"step", "epoch", "loss", "samples_per_s", "wall_s"}) {
      EXPECT_TRUE(record.contains(key)) << key << " in " << line;
    }
    ++records;
    evaluations += record.contains("test_accuracy");
  }
  EXPECT_EQ(records, 8 + 2);
  EXPECT_EQ(evaluations, 2);
}

TEST_F(CliTest, TrainsAtReducedPrecision) {
  for (const std::string precision : {"tf32", "bf16"}) {
    const fs::path out = directory_ / precision;
    run_result result = troupe("train " + tiny_job().string() + " --set 'training.precision=\"" +
                               precision + "\"' --set parallelism.stages=2 --out " + out.string());
    ASSERT_EQ(result.status, 0) << result.errors;
    auto config = nlohmann::json::parse(read_file(out / "config.json"));
    EXPECT_EQ(config["training"]["precision"], precision);
    auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
    EXPECT_GT(summary["final_test_accuracy"].get<double>(), 0.5) << precision;
  }
  expect_one_line(troupe("train " + tiny_job().string() + " --set 'training.precision=\"fp16\"'"),
                  "training.precision");
}

TEST_F(CliTest, SetOverridesTheJobFile) {
  const fs::path out = directory_ / "run";
  run_result result =
      troupe("train " + tiny_job().string() +
             " --set training.epochs=1 --set training.optimizer=adam --out " + out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  auto config = nlohmann::json::parse(read_file(out / "config.json"));
  EXPECT_EQ(config["training"]["optimizer"], "adam");
  EXPECT_EQ(nlohmann::json::parse(read_file(out / "summary.json"))["epochs"], 1);
}

TEST_F(CliTest, MissingJobFile) {
  expect_one_line(troupe("train " + (directory_ / "absent.toml").string()), "absent.toml");
}

TEST_F(CliTest, UnknownKey) {
  expect_one_line(troupe("train " + tiny_job().string() + " --set training.lrr=0.1"),
                  "training.lrr");
}

TEST_F(CliTest, WrongType) {
  expect_one_line(troupe("train " + tiny_job().string() + " --set 'training.batch_size=\"big\"'"),
                  "training.batch_size");
}

TEST_F(CliTest, ShapesThatDoNotChain) {
  expect_one_line(troupe("train " + tiny_job().string() +
                         " --set 'model.layers=[{type=\"conv2d\",out=2,kernel=3}]'"),
                  "model.layers[0] (conv2d)");
}

TEST_F(CliTest, LastLayerMustMatchClasses) {
  expect_one_line(
      troupe("train " + tiny_job().string() + " --set 'model.layers=[{type=\"linear\",out=3}]'"),
      "per class");
}

TEST_F(CliTest, ModelTooLargeForMemory) {
  expect_one_line(troupe("train " + tiny_job().string() +
                         " --set 'model.layers=[{type=\"linear\",out=2000000000},"
                         "{type=\"linear\",out=4}]'"),
                  "more than this machine's memory");
}

TEST_F(CliTest, BatchLargerThanTrainingSet) {
  expect_one_line(troupe("train " + tiny_job().string() + " --set training.batch_size=1024"),
                  "training.batch_size");
}

TEST_F(CliTest, MissingDataFiles) {
  expect_one_line(
      troupe("train " + tiny_job().string() + " --set data.dataset=fashion-mnist --set data.path=" +
             (directory_ / "nowhere").string() + " --set 'model.input_shape=[1,28,28]'" +
             " --set 'model.layers=[{type=\"flatten\"},{type=\"linear\",out=10}]'"),
      "nowhere");
}

TEST_F(CliTest, CorruptIdxHeader) {
  const fs::path data = directory_ / "data";
  fs::create_directories(data);
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"}) {
    gzFile file = gzopen((data / name).c_str(), "wb");
    const char garbage[] = "this is not an IDX file at all";
    gzwrite(file, garbage, sizeof garbage);
    gzclose(file);
  }
  expect_one_line(troupe("train " + tiny_job().string() +
                         " --set data.dataset=fashion-mnist --set data.path=" + data.string() +
                         " --set 'model.input_shape=[1,28,28]'" +
                         " --set 'model.layers=[{type=\"flatten\"},{type=\"linear\",out=10}]'"),
                  "train-images-idx3-ubyte.gz");
}

TEST_F(CliTest, UnknownOptionAndUnknownDevice) {
  EXPECT_EQ(troupe("train " + tiny_job().string() + " --bogus").status, 2);
  EXPECT_EQ(troupe("frobnicate").status, 2);
  expect_one_line(troupe("train " + tiny_job().string() + " --set parallelism.devices=tpu"),
                  "parallelism.devices");
}

TEST_F(CliTest, PipelinedRunWritesStagesAndTrace) {
  // In one process, and with each stage in a worker process of its own (whose spans travel to
  // the coordinator at the end).
  for (const std::string workers : {"", " --workers 3"}) {
    const fs::path out = directory_ / ("run" + std::to_string(workers.size()));
    run_result result = troupe("train " + tiny_job().string() +
                               " --set parallelism.stages=3 --set parallelism.mode=async"
                               " --set parallelism.max_active_keys=3 --set metrics.trace=true"
                               " --out " +
                               out.string() + workers);
    ASSERT_EQ(result.status, 0) << workers << "\n" << result.errors;
    auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
    ASSERT_EQ(summary["stages"].size(), 3u);
    for (const auto& stage : summary["stages"]) {
      // Three keys in flight, one step per key: a backward sees at most 2 newer versions.
      EXPECT_LE(stage["staleness_histogram"].size(), 3u) << workers;
      EXPECT_EQ(stage["optimizer_steps"], 32) << workers;
    }
    auto trace = nlohmann::json::parse(read_file(out / "trace.json"));
    std::map<int, int> forwards;  // by Chrome thread id: stage + 1
    for (const auto& event : trace["traceEvents"]) {
      if (event["name"] == "forward") ++forwards[event["tid"].get<int>()];
    }
    // Stages 0 and 1, one key per step, 32 steps in 2 epochs.
    EXPECT_EQ(forwards, (std::map<int, int>{{1, 32}, {2, 32}})) << workers;
  }
}

TEST_F(CliTest, BadPipelineSettings) {
  expect_one_line(troupe("train " + tiny_job().string() + " --set parallelism.stages=9"),
                  "parallelism.stages");
  expect_one_line(troupe("train " + tiny_job().string() + " --set parallelism.max_active_keys=0"),
                  "parallelism.max_active_keys");
  expect_one_line(troupe("train " + tiny_job().string() + " --set parallelism.schedule=zigzag"),
                  "parallelism.schedule");
  expect_one_line(troupe("train " + tiny_job().string() + " --set parallelism.devices=cuda:7"),
                  "parallelism.devices");
}

TEST_F(CliTest, InterleavedWithOneVirtualStageSaysItRunsAs1F1B) {
  const std::string interleaved =
      " --set parallelism.stages=2 --set parallelism.mode=sync --set "
      "parallelism.schedule=interleaved --set parallelism.micro_batches=2 --set "
      "training.max_steps=2 --quiet --out ";
  const std::string note = "with parallelism.virtual_stages = 1 runs as 1F1B";
  run_result result =
      troupe("train " + tiny_job().string() + interleaved + (directory_ / "one").string());
  ASSERT_EQ(result.status, 0) << result.errors;
  EXPECT_NE(result.errors.find(note), std::string::npos) << result.errors;
  result = troupe("train " + tiny_job().string() + interleaved + (directory_ / "two").string() +
                  " --set parallelism.virtual_stages=2");
  ASSERT_EQ(result.status, 0) << result.errors;
  EXPECT_EQ(result.errors.find(note), std::string::npos) << result.errors;
}

TEST_F(CliTest, LocalWorkerProcessesTrainLikeOneProcess) {
  const std::string sync = " --set parallelism.stages=3 --set parallelism.micro_batches=2";
  run_result one =
      troupe("train " + tiny_job().string() + sync + " --out " + (directory_ / "one").string());
  ASSERT_EQ(one.status, 0) << one.errors;
  run_result many = troupe("train " + tiny_job().string() + sync + " --workers 2 --out " +
                           (directory_ / "many").string());
  ASSERT_EQ(many.status, 0) << many.errors;
  auto expected = nlohmann::json::parse(read_file(directory_ / "one" / "summary.json"));
  auto actual = nlohmann::json::parse(read_file(directory_ / "many" / "summary.json"));
  EXPECT_EQ(actual["final_test_loss"], expected["final_test_loss"]);
  EXPECT_EQ(actual["final_test_accuracy"], expected["final_test_accuracy"]);
  EXPECT_EQ(actual["stages"].size(), 3u);
  // The operating system's account of each process: one here, the coordinator and two workers
  // there, whose stages together are all three.
  ASSERT_EQ(expected["processes"].size(), 1u) << expected.dump();
  EXPECT_EQ(expected["processes"][0]["role"], "process");
  EXPECT_EQ(expected["processes"][0]["stages"], nlohmann::json({0, 1, 2}));
  ASSERT_EQ(actual["processes"].size(), 3u) << actual.dump();
  EXPECT_EQ(actual["processes"][0]["role"], "coordinator");
  std::vector<int> hosted;
  for (size_t i = 1; i < 3; ++i) {
    const auto& worker = actual["processes"][i];
    EXPECT_EQ(worker["role"], "worker");
    EXPECT_GT(worker["pid"].get<int64_t>(), 0);
    EXPECT_GT(worker["user_s"].get<double>() + worker["system_s"].get<double>(), 0.0);
    for (const auto& stage : worker["stages"]) hosted.push_back(stage.get<int>());
  }
  std::sort(hosted.begin(), hosted.end());
  EXPECT_EQ(hosted, (std::vector<int>{0, 1, 2}));
}

/// A 2-stage async job that trains far longer than any test waits, with no restarts: a lost
/// worker ends it.
std::string endless_two_stage_job() {
  return R"(
[model]
input_shape = [64]
layers = [{ type = "linear", out = 256 }, { type = "relu" }, { type = "linear", out = 256 },
          { type = "relu" }, { type = "linear", out = 4 }]
[data]
dataset = "synthetic"
synthetic_train = 4096
synthetic_test = 64
classes = 4
[parallelism]
stages = 2
mode = "async"
[training]
batch_size = 8
epochs = 1000
[checkpoint]
max_restarts = 0
[metrics]
log_interval = 1
)";
}

TEST_F(CliTest, KilledWorkerIsNamedByTheCoordinator) {
  const fs::path job = write("long.toml", endless_two_stage_job());
  const std::string address = "ipc://" + (directory_ / "coordinator").string();
  const fs::path out = directory_ / "run";
  pid_t coordinator =
      spawn_troupe({"coordinator", job.string(), "--listen", address, "--workers", "2",
                    "--heartbeat-timeout", "1", "--quiet", "--out", out.string()},
                   directory_ / "coordinator.txt");
  std::vector<pid_t> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(spawn_troupe(
        {"worker", "--coordinator", address, "--listen",
         "ipc://" + (directory_ / ("w" + std::to_string(w))).string(), "--heartbeat-timeout", "1"},
        directory_ / ("worker" + std::to_string(w) + ".txt")));
  }
  // Training is under way once metrics lines appear.
  ASSERT_TRUE(wait_until([&] { return read_file(out / "metrics.jsonl").size() > 200; }, 60));
  kill(workers[1], SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  int status = 0;
  bool exited = false;
  ASSERT_TRUE(wait_until(
      [&] { return exited = exited || waitpid(coordinator, &status, WNOHANG) == coordinator; },
      30));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(seconds, 10.0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  const std::string errors = read_file(directory_ / "coordinator.txt");
  EXPECT_NE(errors.find("stopped responding"), std::string::npos) << errors;
  EXPECT_NE(errors.find("pid " + std::to_string(workers[1])), std::string::npos) << errors;
  EXPECT_NE(errors.find("(stage "), std::string::npos) << errors;
  for (pid_t worker : workers) {
    kill(worker, SIGKILL);
    waitpid(worker, nullptr, 0);
  }
}

// `train --workers` started its workers itself, so it hears of a worker's death from the
// kernel at once: the report says how the process ended, long before the heartbeat timeout
// (an hour here) would have called it silent.
TEST_F(CliTest, LocalWorkerDeathIsReportedAtOnceWithHowItEnded) {
  const fs::path job = write("long.toml", endless_two_stage_job());
  const fs::path out = directory_ / "run";
  const pid_t train = spawn_troupe({"train", job.string(), "--workers", "2", "--heartbeat-timeout",
                                    "3600", "--quiet", "--out", out.string()},
                                   directory_ / "train.txt");
  ASSERT_TRUE(wait_until([&] { return read_file(out / "metrics.jsonl").size() > 200; }, 60));
  const std::vector<pid_t> workers = children_of(train);
  ASSERT_EQ(workers.size(), 2u);
  kill(workers[0], SIGKILL);
  int status = 0;
  bool exited = false;
  const bool ended =
      wait_until([&] { return exited = exited || waitpid(train, &status, WNOHANG) == train; }, 60);
  if (!ended) {
    kill(train, SIGKILL);
    waitpid(train, nullptr, 0);
  }
  ASSERT_TRUE(ended) << "the run went on after its worker was killed";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1);
  const std::string errors = read_file(directory_ / "train.txt");
  EXPECT_NE(errors.find("worker pid " + std::to_string(workers[0])), std::string::npos) << errors;
  EXPECT_NE(errors.find("was killed by signal 9"), std::string::npos) << errors;
  EXPECT_EQ(errors.find("stopped responding"), std::string::npos) << errors;
}

/// A 3-stage sync job whose in-process result the launcher runs must reproduce.
std::string launch_job_overrides() {
  return " --set parallelism.stages=3 --set parallelism.micro_batches=2 --quiet";
}

TEST_F(CliTest, LaunchUnderMpirun) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
  const std::string job = tiny_job().string() + launch_job_overrides();
  ASSERT_EQ(troupe("train " + job + " --out " + (directory_ / "one").string()).status, 0);
  const std::string command = "mpirun --allow-run-as-root --oversubscribe -np 3 " +
                              std::string(TROUPE_BINARY) + " launch " + job + " --port " +
                              std::to_string(29000 + getpid() % 1000) + " --out " +
                              (directory_ / "mpi").string() + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0);
  EXPECT_EQ(
      nlohmann::json::parse(read_file(directory_ / "mpi" / "summary.json"))["final_test_loss"],
      nlohmann::json::parse(read_file(directory_ / "one" / "summary.json"))["final_test_loss"]);
}

/// Runs three `troupe launch` ranks with the variables `variables(rank)` sets; true when all
/// exit 0.
bool launch_three(const std::string& job, const std::function<std::string(int)>& variables,
                  const fs::path& out) {
  std::string script;
  for (int rank = 0; rank < 3; ++rank) {
    script += "env " + variables(rank) + " " + TROUPE_BINARY + " launch " + job +
              (rank == 0 ? " --out " + out.string() : std::string()) + " >/dev/null 2>&1 & ";
  }
  script += "fail=0; for job in $(jobs -p); do wait $job || fail=1; done; exit $fail";
  return std::system(("bash -c '" + script + "'").c_str()) == 0;
}

TEST_F(CliTest, LaunchUnderTorchrunAndSlurmVariables) {
  const std::string job = tiny_job().string() + launch_job_overrides();
  ASSERT_EQ(troupe("train " + job + " --out " + (directory_ / "one").string()).status, 0);
  const auto expected =
      nlohmann::json::parse(read_file(directory_ / "one" / "summary.json"))["final_test_loss"];
  const std::string port = std::to_string(30000 + getpid() % 1000);
  ASSERT_TRUE(launch_three(
      job,
      [&](int rank) {
        return "RANK=" + std::to_string(rank) + " WORLD_SIZE=3 LOCAL_RANK=" + std::to_string(rank) +
               " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port;
      },
      directory_ / "torchrun"));
  EXPECT_EQ(
      nlohmann::json::parse(read_file(directory_ / "torchrun" / "summary.json"))["final_test_loss"],
      expected);
  const std::string slurm_port = std::to_string(31000 + getpid() % 1000);
  ASSERT_TRUE(launch_three(
      job,
      [&](int rank) {
        return "SLURM_PROCID=" + std::to_string(rank) +
               " SLURM_NTASKS=3 SLURM_JOB_NODELIST=localhost SLURM_TASKS_PER_NODE=3"
               " TROUPE_COORDINATOR_PORT=" +
               slurm_port;
      },
      directory_ / "slurm"));
  EXPECT_EQ(
      nlohmann::json::parse(read_file(directory_ / "slurm" / "summary.json"))["final_test_loss"],
      expected);
}

TEST_F(CliTest, BenchWritesJson) {
  const fs::path json = directory_ / "bench.json";
  run_result result = troupe("bench compute --threads 1 --seconds 0.05 --json " + json.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  auto figures = nlohmann::json::parse(read_file(json));
  EXPECT_GT(figures["sgemm_2048_gflops"].get<double>(), 0.0);
  ASSERT_EQ(figures["training"].size(), 2u);
  EXPECT_GT(figures["training"][0]["fraction_of_peak"].get<double>(), 0.0);
  EXPECT_EQ(figures["layers"].size(), 8u);
}

}  // namespace
