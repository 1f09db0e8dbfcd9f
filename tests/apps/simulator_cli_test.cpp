// `troupe simulate`, `troupe calibrate` and `troupe validate` as a user meets them: a
// simulation's summary, a calibrated profile that the simulator charges, and real runs set
// beside their predictions.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/cli_helpers.h"

namespace {

namespace fs = std::filesystem;

using namespace troupe::testing;

class SimulatorCliTest : public troupe_command_test {};

TEST_F(SimulatorCliTest, SimulateWritesItsSummaryAndRefusesABadClusterFileByField) {
  const std::string cluster =
      std::string(TROUPE_SOURCE_DIR) + "/apps/examples/cluster_ethernet_16_nodes.toml";
  const fs::path out = directory_ / "simulated";
  run_result result = troupe("simulate " + tiny_job().string() + " --cluster " + cluster +
                             " --set parallelism.stages=2 --out " + out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
  for (const char* key : {"samples_per_s", "stage_utilization", "stage_idle_fraction", "events",
                          "events_per_s", "wall_s", "trace_hash"}) {
    EXPECT_TRUE(summary.contains(key)) << key;
  }
  EXPECT_EQ(summary["stage_utilization"].size(), 2u);
  EXPECT_GT(summary["samples_per_s"].get<double>(), 0);
  EXPECT_TRUE(fs::exists(out / "trace.json"));

  const fs::path bad = write("bad.toml", R"(
[device_types.gpu]
peak_flops = 1e14
memory_bandwidth = 1e12
memory_bytes = 1e10
[[nodes]]
name = "n"
device_type = "gpu"
devices = 2
device_link = { bandwidth = 1e10, latency_s = -1 }
nic = { bandwidth = 1e10 }
)");
  expect_one_line(troupe("simulate " + tiny_job().string() + " --cluster " + bad.string()),
                  "nodes[0].device_link.latency_s");
  const fs::path missing = write("missing.toml", R"(
[device_types.gpu]
peak_flops = 1e14
memory_bytes = 1e10
[[nodes]]
name = "n"
device_type = "gpu"
devices = 2
device_link = { bandwidth = 1e10 }
nic = { bandwidth = 1e10 }
)");
  expect_one_line(troupe("simulate " + tiny_job().string() + " --cluster " + missing.string()),
                  "device_types.gpu.memory_bandwidth");
  const fs::path placed = write("placed.toml", read_file(cluster) +
                                                   "\n[placement]\nstages = [\"node0/gpu0\", "
                                                   "\"node99/gpu0\"]\n");
  expect_one_line(troupe("simulate " + tiny_job().string() + " --cluster " + placed.string() +
                         " --set parallelism.stages=2"),
                  "node99/gpu0");
  const std::string text = read_file(cluster);
  const fs::path stored =
      write("stored.toml", text.substr(0, text.find("[storage]")) + "[storage]\nlatency_s = 0.1\n");
  expect_one_line(troupe("simulate " + tiny_job().string() + " --cluster " + stored.string()),
                  "storage.bandwidth: missing");
  expect_one_line(
      troupe("simulate " + tiny_job().string() + " --cluster " + cluster + " --fail node0/gpu9@1"),
      "--fail node0/gpu9@1: no device named \"node0/gpu9\"");
  expect_one_line(troupe("simulate " + tiny_job().string() + " --cluster " + cluster +
                         " --fail node0/gpu0@soon"),
                  "SECONDS must be a number");

  // A failure with checkpoints to go back to: the summary counts both.
  const fs::path recovered = directory_ / "recovered";
  result = troupe("simulate " + tiny_job().string() + " --cluster " + cluster +
                  " --set parallelism.stages=2 --set checkpoint.interval_steps=2"
                  " --fail node0/gpu1@0 --heartbeat-timeout 1 --restart-s 0.5 --out " +
                  recovered.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  summary = nlohmann::json::parse(read_file(recovered / "summary.json"));
  EXPECT_EQ(summary["restarts"], 1);
  EXPECT_GE(summary["recovery_s"].get<double>(), 1.5);
  EXPECT_GT(summary["checkpoints"].get<int>(), 0);
}

std::string dgx_cluster() {
  return std::string(TROUPE_SOURCE_DIR) + "/apps/examples/cluster_dgx_node.toml";
}

/// The tiny job as a 2-stage sync pipeline of two micro-batches, for two steps.
const char* const two_sync_stages =
    " --set parallelism.stages=2 --set parallelism.mode=sync --set parallelism.micro_batches=2 "
    "--set training.max_steps=2";

TEST_F(SimulatorCliTest, AScheduleSweepSaysWhichRowInterleavesNothing) {
  const std::string cluster = dgx_cluster();
  run_result result = troupe(
      "simulate " + tiny_job().string() + " --cluster " + cluster + two_sync_stages +
      " --sweep parallelism.schedule=gpipe,interleaved --out " + (directory_ / "one").string());
  ASSERT_EQ(result.status, 0) << result.errors;
  const std::string note = "with parallelism.virtual_stages = 1 runs as 1F1B";
  EXPECT_NE(result.errors.find(note), std::string::npos) << result.errors;
  EXPECT_NE(result.errors.find("(the row interleaved)"), std::string::npos) << result.errors;
  EXPECT_EQ(result.errors.find("(the row gpipe)"), std::string::npos) << result.errors;
}

TEST_F(SimulatorCliTest, SettingsAreRowsOfOverridesEachNamed) {
  const std::string cluster = dgx_cluster();
  const fs::path out = directory_ / "settings";
  // Interleaving takes two keys at once: the schedule and the chunks per worker.
  run_result result =
      troupe("simulate " + tiny_job().string() + " --cluster " + cluster + two_sync_stages +
             " --setting gpipe:parallelism.schedule=gpipe --setting "
             "interleaved-v2:parallelism.schedule=interleaved,parallelism.virtual_stages=2 --out " +
             out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  EXPECT_EQ(result.errors.find("runs as 1F1B"), std::string::npos) << result.errors;
  // The interleaved row's 2 stages run on one worker; the gpipe row's on two.
  EXPECT_NE(result.errors.find("interleaved runs the 2 stages as 2 chunks on one worker "
                               "(device); other schedules give each stage a worker of its own "
                               "(the row interleaved-v2)"),
            std::string::npos)
      << result.errors;
  EXPECT_EQ(result.errors.find("(the row gpipe)"), std::string::npos) << result.errors;
  EXPECT_EQ(result.output.rfind("setting ", 0), 0u) << result.output;
  EXPECT_NE(result.output.find("\ngpipe "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("\ninterleaved-v2 "), std::string::npos) << result.output;
  auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
  EXPECT_EQ(summary["sweep"]["key"], "setting");
  const nlohmann::json runs = summary["sweep"]["runs"];
  ASSERT_EQ(runs.size(), 2u) << summary.dump();
  EXPECT_EQ(runs[0]["setting"], "gpipe");
  EXPECT_EQ(runs[1]["setting"], "interleaved-v2");
  // Two chunks on one worker: one device's utilization per chunk, against two devices' work.
  EXPECT_NE(runs[0]["samples_per_s"], runs[1]["samples_per_s"]) << runs.dump();

  expect_one_line(
      troupe("simulate " + tiny_job().string() + " --cluster " + cluster + " --setting nocolon"),
      "--setting nocolon: expected NAME:KEY=VALUE");
  expect_one_line(troupe("simulate " + tiny_job().string() + " --cluster " + cluster +
                         " --setting wide:parallelism.stagez=2"),
                  "setting wide: ");
  // A bad row after good ones is refused before the table starts: no header, no rows.
  const run_result late =
      troupe("simulate " + tiny_job().string() + " --cluster " + cluster +
             " --setting fine:parallelism.stages=2 --setting wide:parallelism.stagez=2");
  expect_one_line(late, "setting wide: ");
  EXPECT_EQ(late.output, "");
}

TEST_F(SimulatorCliTest, ValidateRunsEveryConfigurationForRealAndSimulatesIt) {
  const fs::path job =
      write("validated.toml", mlp_model("tanh", "tanh") + synthetic_data(2048, 64) + R"(
[training]
batch_size = 32
lr = 0.05
)");
  const fs::path out = directory_ / "validated";
  run_result result = troupe("validate " + job.string() +
                             " --steps 8 --runs 1 --seconds 0.01 --out " + out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  const auto rows = nlohmann::json::parse(read_file(out / "validation.json"));
  ASSERT_EQ(rows.size(), 12u);
  for (const auto& row : rows) {
    const std::string name = row.dump();
    const double measured = row["measured_samples_per_s"].get<double>();
    const double predicted = row["predicted_samples_per_s"].get<double>();
    EXPECT_GT(measured, 0) << name;
    EXPECT_GT(predicted, 0) << name;
    EXPECT_GT(row["cpu_us_per_sample"].get<double>(), 0) << name;
    // A share of the CPU time (a run of 8 steps can be all kernel time at the tick's resolution).
    EXPECT_GT(row["kernel_fraction"].get<double>(), 0) << name;
    EXPECT_LE(row["kernel_fraction"].get<double>(), 1) << name;
    // One run: its own error is the median.
    EXPECT_NEAR(row["error"].get<double>(), predicted / measured - 1, 1e-9) << name;
    EXPECT_EQ(row["measured_runs"].size(), 1u) << name;
    ASSERT_EQ(row["predicted_runs"].size(), 1u) << name;
    EXPECT_EQ(row["predicted_runs"][0].get<double>(), predicted) << name;
    // A run's prediction is the mean of the calibrations just before and just after it.
    ASSERT_EQ(row["predicted_before_runs"].size(), 1u) << name;
    ASSERT_EQ(row["predicted_after_runs"].size(), 1u) << name;
    EXPECT_NEAR(predicted,
                (row["predicted_before_runs"][0].get<double>() +
                 row["predicted_after_runs"][0].get<double>()) /
                    2,
                1e-9 * predicted)
        << name;
    // The machine's drift while the row ran: one run has no spread; two calibrations have
    // theirs, largest over smallest - 1.
    EXPECT_EQ(row["run_spread"].get<double>(), 0) << name;
    const double before = row["predicted_before_runs"][0].get<double>();
    const double after = row["predicted_after_runs"][0].get<double>();
    EXPECT_NEAR(row["calibration_spread"].get<double>(),
                std::max(before, after) / std::min(before, after) - 1, 1e-9)
        << name;
    const int workers = row["workers"].get<int>();
    EXPECT_TRUE(workers == 0 || workers == row["stages"].get<int>()) << name;
    // Each measurement is a real run of its own, with its summary.
    const std::string run = row["mode"].get<std::string>() + "-s" +
                            std::to_string(row["stages"].get<int>()) +
                            (workers > 0 ? "-workers" : "") + "-1";
    const auto summary = nlohmann::json::parse(read_file(out / run / "summary.json"));
    EXPECT_EQ(summary["samples_per_s"].get<double>(),
              row["whole_run_measured_runs"][0].get<double>())
        << name;
    EXPECT_EQ(summary["steps"].get<int>(), 8) << name;
    // The row's rate leaves out the warm-up (the first tenth of the steps, at least one): the
    // run logs every warm-up's worth of steps, and the rate runs from the first such record.
    ASSERT_EQ(row["warm_up_steps"].get<int>(), 1) << name;
    std::vector<std::pair<int64_t, double>> records;  // step, wall_s
    std::istringstream metrics(read_file(out / run / "metrics.jsonl"));
    for (std::string line; std::getline(metrics, line);) {
      const auto record = nlohmann::json::parse(line);
      if (record.contains("test_accuracy")) continue;
      records.push_back({record["step"].get<int64_t>(), record["wall_s"].get<double>()});
      EXPECT_EQ(records.back().first, static_cast<int64_t>(records.size())) << line;
    }
    ASSERT_EQ(records.size(), 8u) << name;
    const double steady = 7 * 32 / (records.back().second - records.front().second);
    EXPECT_NEAR(measured, steady, 1e-6 * measured) << name;
    // Both calibrations are kept beside the runs: one run, two calibrations.
    for (int index : {1, 2}) {
      const std::string profile = row["mode"].get<std::string>() + "-s" +
                                  std::to_string(row["stages"].get<int>()) + "-profile-" +
                                  std::to_string(index) + ".json";
      const auto calibration = nlohmann::json::parse(read_file(out / profile));
      EXPECT_FALSE(calibration["blocks"].empty()) << name << profile;
      // Time-slicing is measured when the stages outnumber the cores, and only then.
      const double efficiency = calibration["time_slice_efficiency"].get<double>();
      if (static_cast<unsigned>(row["stages"].get<int>()) > std::thread::hardware_concurrency()) {
        EXPECT_GT(efficiency, 0) << name << profile;
        EXPECT_LE(efficiency, 1) << name << profile;
      } else {
        EXPECT_EQ(efficiency, 1) << name << profile;
      }
    }
    EXPECT_FALSE(fs::exists(out / (row["mode"].get<std::string>() + "-s" +
                                   std::to_string(row["stages"].get<int>()) + "-profile-3.json")))
        << name;
  }
  // The table: a header and one line per configuration, the runs' own output in their logs.
  std::istringstream table(result.output);
  std::vector<std::string> lines;
  for (std::string line; std::getline(table, line);) lines.push_back(line);
  // Below four cores, a last line warns that the 4-worker rows oversubscribe them.
  const bool oversubscribed = std::thread::hardware_concurrency() < 4;
  ASSERT_EQ(lines.size(), oversubscribed ? 18u : 17u) << result.output;
  EXPECT_EQ(lines[12].rfind("async", 0), 0u) << lines[12];
  EXPECT_NE(lines[12].find("--workers 4"), std::string::npos) << lines[12];
  EXPECT_NE(lines[13].find("after each run's first 1 steps, its warm-up; medians of 1 runs"),
            std::string::npos)
      << lines[13];
  EXPECT_NE(lines[13].find("median of the runs' predicted/measured - 1"), std::string::npos)
      << lines[13];
  EXPECT_NE(lines[14].find("CPU time per training sample"), std::string::npos) << lines[14];
  EXPECT_NE(lines[15].find("largest over smallest - 1"), std::string::npos) << lines[15];
  // The count of rows within 10 %, as the table's errors give it, and of the others those
  // inside the spread of their calibrations or runs.
  size_t within = 0, inside_spread = 0;
  for (const auto& row : rows) {
    const double error = std::abs(row["error"].get<double>());
    const double spread =
        std::max(row["calibration_spread"].get<double>(), row["run_spread"].get<double>());
    within += error <= 0.10 ? 1 : 0;
    inside_spread += error > 0.10 && error <= spread ? 1 : 0;
  }
  EXPECT_EQ(lines[16].rfind(std::to_string(within) + " of 12 rows within 10%", 0), 0u) << lines[16];
  EXPECT_EQ(lines[16].find("; " + std::to_string(inside_spread) + " more whose error") !=
                std::string::npos,
            inside_spread > 0)
      << lines[16];
  if (oversubscribed) {
    EXPECT_NE(lines[17].find("as fast as a stand-in pipeline"), std::string::npos) << lines[17];
  }
  EXPECT_NE(read_file(out / "sync-s2-1" / "train.log").find("final_test_accuracy"),
            std::string::npos);

  expect_one_line(troupe("validate " + job.string() + " --set training.lr=-1 --out " +
                         (directory_ / "refused").string()),
                  "training.lr");
}

TEST_F(SimulatorCliTest, ValidateLeavesOutTheWorkerRowsOfReplicasThatSumInSharedMemory) {
  const fs::path job =
      write("shared.toml", mlp_model("tanh", "tanh") + synthetic_data(2048, 64) + R"(
[parallelism]
collective = "shared_memory"
[training]
batch_size = 32
lr = 0.05
)");
  const fs::path out = directory_ / "shared";
  run_result result =
      troupe("validate " + job.string() +
             " --stages 1 --replicas 1 2 --steps 8 --runs 1 --seconds 0.01 --out " + out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  const auto rows = nlohmann::json::parse(read_file(out / "validation.json"));
  // R = 1 in one process and in a worker; R = 2 in one process only: sync and async.
  ASSERT_EQ(rows.size(), 6u) << rows.dump();
  for (const auto& row : rows) {
    EXPECT_GT(row["measured_samples_per_s"].get<double>(), 0) << row.dump();
    EXPECT_GT(row["predicted_samples_per_s"].get<double>(), 0) << row.dump();
    if (row["replicas"] == 2) {
      EXPECT_EQ(row["workers"], 0) << row.dump();
    }
  }
  EXPECT_NE(result.output.find("(sync-s1-r2: no --workers row: parallelism.collective = "
                               "\"shared_memory\" sums the replicas in one process"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.errors.find("[1/6]"), std::string::npos) << result.errors;
  EXPECT_NE(result.errors.find("[6/6]"), std::string::npos) << result.errors;
}

TEST_F(SimulatorCliTest, CalibrateWritesAProfileThatSimulateUses) {
  const fs::path profile = directory_ / "profile.json";
  run_result calibrated =
      troupe("calibrate " + tiny_job().string() + " --seconds 0.01 --out " + profile.string());
  ASSERT_EQ(calibrated.status, 0) << calibrated.errors;
  auto measured = nlohmann::json::parse(read_file(profile));
  ASSERT_EQ(measured["blocks"].size(), 3u);
  EXPECT_EQ(measured["blocks"][0]["type"], "linear");
  EXPECT_GT(measured["blocks"][0]["forward_s"].get<double>(), 0);
  const std::string cluster =
      std::string(TROUPE_SOURCE_DIR) + "/apps/examples/cluster_this_machine.toml";
  const fs::path out = directory_ / "simulated";
  run_result simulated = troupe("simulate " + tiny_job().string() + " --cluster " + cluster +
                                " --profile " + profile.string() + " --out " + out.string());
  ASSERT_EQ(simulated.status, 0) << simulated.errors;
  EXPECT_GT(nlohmann::json::parse(read_file(out / "summary.json"))["samples_per_s"].get<double>(),
            0);
  measured["blocks"][1].erase("step_s");
  const fs::path broken = write("broken.json", measured.dump());
  expect_one_line(troupe("simulate " + tiny_job().string() + " --cluster " + cluster +
                         " --profile " + broken.string()),
                  "blocks[1].step_s: missing");
}

TEST_F(SimulatorCliTest, AGraphJobIsCalibratedNodeByNodeAndSimulated) {
  const std::string job = std::string(TROUPE_SOURCE_DIR) + "/apps/examples/listops_tree_lstm.toml";
  const std::string small =
      " --set data.synthetic_train=256 --set data.synthetic_test=16 --set training.batch_size=8"
      " --set training.max_steps=4";
  const fs::path profile = directory_ / "graph_profile.json";
  run_result calibrated =
      troupe("calibrate " + job + small + " --seconds 0.01 --out " + profile.string());
  ASSERT_EQ(calibrated.status, 0) << calibrated.errors;
  EXPECT_NE(calibrated.output.find("cell"), std::string::npos) << calibrated.output;
  auto measured = nlohmann::json::parse(read_file(profile));
  ASSERT_EQ(measured["nodes"].size(), 3u);
  EXPECT_EQ(measured["nodes"][1]["name"], "cell");
  const std::string cluster =
      std::string(TROUPE_SOURCE_DIR) + "/apps/examples/cluster_this_machine.toml";
  const fs::path out = directory_ / "graph_simulated";
  for (const std::string with : {std::string(), " --profile " + profile.string()}) {
    run_result simulated = troupe("simulate " + job + small + " --cluster " + cluster + with +
                                  " --out " + out.string());
    ASSERT_EQ(simulated.status, 0) << simulated.errors;
    const auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
    EXPECT_GT(summary["samples_per_s"].get<double>(), 0) << with;
  }
}

}  // namespace
