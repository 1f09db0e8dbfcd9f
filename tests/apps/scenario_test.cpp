// One script of protocol events through the real engine and through the simulator. A sync job
// that checkpoints every 50 steps loses a worker after its first checkpoint and recovers. The
// real coordinator (worker processes) and the simulator drive the same machines (training_run,
// checkpoint_round, recovery), so both must report the same protocol: checkpoints at the same
// steps, the loss, a recovery from the latest checkpoint before it, and the same checkpoints
// again to the end.

#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/cli_helpers.h"

namespace troupe::testing {
namespace {

using json = nlohmann::json;

/// The protocol events of a run's metrics.jsonl, each as its name and the step it names
/// (checkpoint: the step saved; recovered: the step resumed from; worker_lost: -1).
std::vector<std::pair<std::string, int64_t>> protocol_events(const fs::path& metrics) {
  std::vector<std::pair<std::string, int64_t>> events;
  std::istringstream lines(read_file(metrics));
  for (std::string line; std::getline(lines, line);) {
    const json record = json::parse(line, nullptr, false);
    if (record.is_discarded() || !record.contains("event")) continue;
    const std::string name = record["event"];
    int64_t step = -1;
    if (name == "checkpoint") step = record.value("step", int64_t{-2});
    if (name == "recovered") step = record.value("resumed_from_step", int64_t{-2});
    events.push_back({name, step});
  }
  return events;
}

/// Virtual seconds of the first checkpoint a simulation's metrics.jsonl reports.
double first_checkpoint_s(const fs::path& metrics) {
  std::istringstream lines(read_file(metrics));
  for (std::string line; std::getline(lines, line);) {
    const json record = json::parse(line, nullptr, false);
    if (!record.is_discarded() && record.value("event", "") == "checkpoint")
      return record.value("virtual_s", 0.0);
  }
  return -1;
}

class ScenarioTest : public troupe_command_test {
 protected:
  const std::string job = std::string(TROUPE_SOURCE_DIR) + "/apps/examples/fashion_mlp_sync.toml";
  const std::vector<std::string> settings = {
      "--set", "training.max_steps=200",    "--set", "checkpoint.interval_steps=50",
      "--set", "checkpoint.max_restarts=2", "--set", "data.test_samples=1000",
      "--set", "metrics.log_interval=50"};

  std::string joined(const std::vector<std::string>& words) {
    std::string text;
    for (const std::string& word : words) text += " '" + word + "'";
    return text;
  }
};

TEST_F(ScenarioTest, ARealRunAndItsSimulationReportTheSameCheckpointsLossAndRecovery) {
  // The real run: two worker processes; one is killed once the first checkpoint is written.
  const fs::path real = directory_ / "real";
  std::vector<std::string> arguments = {"train",   job,     "--workers",  "2",
                                        "--quiet", "--out", real.string()};
  arguments.insert(arguments.end(), settings.begin(), settings.end());
  const pid_t pid = spawn_troupe(arguments, directory_ / "errors.txt");
  ASSERT_TRUE(wait_until(
      [&] { return read_file(real / "metrics.jsonl").find("\"checkpoint\"") != std::string::npos; },
      120));
  std::istringstream children(
      read_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children"));
  pid_t victim = 0;
  ASSERT_TRUE(children >> victim) << "no worker process to kill";
  kill(victim, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << read_file(directory_ / "errors.txt");

  // The simulation: the same job on this machine's model, its second core failing just after
  // the virtual time of the first checkpoint.
  const std::string cluster =
      std::string(TROUPE_SOURCE_DIR) + "/apps/examples/cluster_this_machine.toml";
  const std::string simulate = "simulate " + job + " --cluster " + cluster + " --numerics" +
                               joined(settings) + " --heartbeat-timeout 0.01 --restart-s 0.01";
  const fs::path calm = directory_ / "calm", failing = directory_ / "failing";
  run_result undisturbed = troupe(simulate + " --out " + calm.string());
  ASSERT_EQ(undisturbed.status, 0) << undisturbed.errors;
  const double at = first_checkpoint_s(calm / "metrics.jsonl");
  ASSERT_GT(at, 0);
  run_result simulated = troupe(simulate + " --fail this-machine/cpu1@" +
                                std::to_string(at * 1.05) + " --out " + failing.string());
  ASSERT_EQ(simulated.status, 0) << simulated.errors;

  const auto real_events = protocol_events(real / "metrics.jsonl");
  const auto simulated_events = protocol_events(failing / "metrics.jsonl");
  for (const auto* events : {&real_events, &simulated_events}) {
    std::string line = events == &real_events ? "real:     " : "simulated:";
    for (const auto& [name, step] : *events)
      line += " " + name + (step >= 0 ? " " + std::to_string(step) : "");
    std::printf("%s\n", line.c_str());
  }
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"checkpoint", 50},  {"worker_lost", -1}, {"recovered", 50},
      {"checkpoint", 100}, {"checkpoint", 150}, {"checkpoint", 200}};
  EXPECT_EQ(simulated_events, expected);
  // The real kill lands while the run trains towards step 100 unless this machine is very busy;
  // then a later checkpoint is the one resumed from, by the same rule.
  ASSERT_GE(real_events.size(), 4u);
  size_t lost = 0;
  while (lost < real_events.size() && real_events[lost].first != "worker_lost") ++lost;
  ASSERT_LT(lost + 1, real_events.size()) << "the real run reported no loss and recovery";
  ASSERT_GT(lost, 0u);
  EXPECT_EQ(real_events[lost + 1].first, "recovered");
  EXPECT_EQ(real_events[lost + 1].second, real_events[lost - 1].second)
      << "recovered from the latest checkpoint before the loss";
  if (real_events[lost - 1].second == 50) {
    EXPECT_EQ(real_events, expected) << "the same protocol as the simulation";
  } else {
    EXPECT_EQ(real_events.back(), (std::pair<std::string, int64_t>{"checkpoint", 200}));
  }
}

}  // namespace
}  // namespace troupe::testing
