// Watching a run from the command line: SIGUSR2's status report names the worker processes
// that host the stages, and the dashboard refuses bad addresses and directories that hold no
// run.

#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tests/support/cli_helpers.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::children_of;
using testing::read_file;
using testing::run_result;
using testing::spawn_troupe;
using testing::wait_until;

class MonitorCliTest : public testing::troupe_command_test {
 protected:
  /// A 2-stage async job that trains for a few seconds (it is stopped before its end).
  fs::path long_job() {
    return write("long.toml", R"(
[model]
input_shape = [8]
layers = [{ type = "linear", out = 64 }, { type = "tanh" }, { type = "linear", out = 4 }]
)" + testing::synthetic_data(4096, 128) +
                                  R"(
[parallelism]
stages = 2
mode = "async"
[training]
batch_size = 16
epochs = 2000
lr = 0.05
[metrics]
log_interval = 20
)");
  }

  /// The status events of the run's metrics.jsonl.
  static std::vector<json> status_events(const fs::path& run) {
    std::vector<json> events;
    std::istringstream lines(read_file(run / "metrics.jsonl"));
    for (std::string line; std::getline(lines, line);) {
      json value = json::parse(line, nullptr, false);
      if (value.is_object() && value.value("event", std::string()) == "status")
        events.push_back(value);
    }
    return events;
  }
};

TEST_F(MonitorCliTest, StatusReportOnSigusr2NamesTheWorkersThatHostTheStages) {
  const fs::path run = directory_ / "run";
  const pid_t pid = spawn_troupe(
      {"train", long_job().string(), "--out", run.string(), "--quiet", "--workers", "2"},
      directory_ / "errors.txt");
  // Heartbeats (every 0.5 s) carry the stages' activity: wait for steps, then ask.
  ASSERT_TRUE(wait_until([&] { return read_file(run / "metrics.jsonl").size() > 400; }, 60))
      << read_file(directory_ / "errors.txt");
  ASSERT_TRUE(wait_until(
      [&] {
        kill(pid, SIGUSR2);
        return wait_until([&] { return !status_events(run).empty(); }, 2) &&
               status_events(run).back()["stages"][1].value("version", 0) > 0;
      },
      30));
  kill(pid, SIGTERM);  // a checkpoint, then a clean stop
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << read_file(directory_ / "errors.txt");

  const json report = status_events(run).back();
  ASSERT_EQ(report["stages"].size(), 2u);
  for (int actor = 0; actor < 2; ++actor) {
    const json& stage = report["stages"][actor];
    EXPECT_EQ(stage["actor"], actor);
    EXPECT_NE(stage["worker"].get<std::string>().find("worker pid"), std::string::npos)
        << stage.dump();
    EXPECT_NE(stage["worker"].get<std::string>().find("(stage " + std::to_string(actor) + ")"),
              std::string::npos)
        << stage.dump();
    EXPECT_TRUE(stage["last_sent"].is_object()) << stage.dump();
  }
  const std::string errors = read_file(directory_ / "errors.txt");
  EXPECT_NE(errors.find("troupe: status at"), std::string::npos) << errors;
  EXPECT_NE(errors.find("  stage 1 (worker pid"), std::string::npos) << errors;
}

TEST_F(MonitorCliTest, AStoppedWorkerIsReportedAsAStallOnceTheTimeoutPasses) {
  const fs::path run = directory_ / "run";
  const pid_t pid =
      spawn_troupe({"train", long_job().string(), "--out", run.string(), "--quiet", "--workers",
                    "2", "--heartbeat-timeout", "60", "--set", "metrics.stall_timeout_s=2"},
                   directory_ / "errors.txt");
  ASSERT_TRUE(wait_until([&] { return read_file(run / "metrics.jsonl").size() > 400; }, 60))
      << read_file(directory_ / "errors.txt");
  const std::vector<pid_t> workers = children_of(pid);
  ASSERT_EQ(workers.size(), 2u);
  // A worker that stops answering (SIGSTOP: no work, no heartbeats) stalls the pipeline.
  kill(workers.back(), SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  const auto stall = [&] { return read_file(run / "metrics.jsonl").find("\"event\":\"stall\""); };
  // The deadline only bounds the wait (well inside the heartbeat timeout); when the stall
  // fell due is the report's own silent_s, checked below.
  const bool reported = wait_until([&] { return stall() != std::string::npos; }, 30);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
  kill(workers.back(), SIGCONT);
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(reported) << "no stall event " << seconds << " s after SIGSTOP\n"
                        << read_file(directory_ / "errors.txt");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << read_file(directory_ / "errors.txt");
  const std::string metrics = read_file(run / "metrics.jsonl");
  const size_t line_start = metrics.rfind('\n', stall()) + 1;
  const json report =
      json::parse(metrics.substr(line_start, metrics.find('\n', stall()) - line_start));
  EXPECT_GT(report["keys_in_flight"].get<int64_t>(), 0);
  EXPECT_GE(report["silent_s"].get<double>(), 2);
  // The stopped worker's stage is named by its worker, with what it held at its last heartbeat.
  bool named = false;
  for (const json& stage : report["stages"]) {
    if (stage["worker"].get<std::string>().find("pid " + std::to_string(workers.back())) ==
        std::string::npos) {
      continue;
    }
    named = true;
    EXPECT_GE(stage["heartbeat_age_s"].get<double>(), 1.5) << stage.dump();
  }
  EXPECT_TRUE(named) << report.dump();
  const std::string errors = read_file(directory_ / "errors.txt");
  EXPECT_NE(errors.find("troupe: stalled at"), std::string::npos) << errors;
  EXPECT_NE(errors.find("its last heartbeat"), std::string::npos) << errors;
}

TEST_F(MonitorCliTest, BadDashboardAddressesAndDirectoriesAreRefused) {
  const std::string job = tiny_job().string();
  run_result result = troupe("train " + job + " --dashboard 127.0.0.1:http --quiet");
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.errors.find("--dashboard 127.0.0.1:http: not HOST:PORT"), std::string::npos)
      << result.errors;
  result = troupe("train " + job + " --dashboard 10.1.2.3:8265 --quiet");
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.errors.find("needs --dashboard-token"), std::string::npos) << result.errors;
  EXPECT_FALSE(fs::exists(directory_ / "runs"));

  result = troupe("dashboard " + (directory_ / "nowhere").string());
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.errors.find("is not a directory"), std::string::npos) << result.errors;
  result = troupe("dashboard " + directory_.string());
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.errors.find("not a run directory"), std::string::npos) << result.errors;
  write("metrics.jsonl", "{\"step\": 1}\n[1, 2]\n");
  result = troupe("dashboard " + directory_.string());
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.errors.find("metrics.jsonl line 2: not a JSON object"), std::string::npos)
      << result.errors;
}

}  // namespace
}  // namespace troupe::apps
