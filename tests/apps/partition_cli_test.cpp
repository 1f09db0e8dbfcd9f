// `troupe train` chooses the partition once, prints it with each stage's predicted share, and
// trains with the chosen cut points in every process.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/cli_helpers.h"

namespace {

namespace fs = std::filesystem;

using namespace troupe::testing;

class PartitionCliTest : public troupe_command_test {
 protected:
  /// The 8-16-16-4 MLP (5 blocks) on 2 stages, one short epoch.
  fs::path two_stage_job() {
    return write("mlp.toml", mlp_model("relu", "tanh") + synthetic_data(256, 64) + R"(
[parallelism]
stages = 2
[training]
batch_size = 32
epochs = 1
lr = 0.1
)");
  }

  /// 784-256-4096-64-4 on 2 stages, partition "measured": the 256x4096 layer holds about two
  /// thirds of the work, so whole blocks leave one stage about 80 % of it.
  fs::path wide_job() {
    return write("wide.toml", R"(
[model]
input_shape = [784]
layers = [{ type = "linear", out = 256 }, { type = "relu" }, { type = "linear", out = 4096 },
          { type = "relu" }, { type = "linear", out = 64 }, { type = "relu" },
          { type = "linear", out = 4 }]
)" + synthetic_data(256, 64) + R"(
[parallelism]
stages = 2
partition = "measured"
[training]
batch_size = 64
epochs = 1
lr = 0.05
[checkpoint]
interval_steps = 2
)");
  }

  /// The one line of `output` that starts with "partition (".
  static std::string partition_line(const std::string& output) {
    const size_t start = output.find("partition (");
    if (start == std::string::npos) return {};
    return output.substr(start, output.find('\n', start) - start);
  }
};

TEST_F(PartitionCliTest, MeasuredResolvesToCutPointsThatTheRunAndItsConfigShow) {
  for (const std::string workers : {"", " --workers 2"}) {
    const fs::path out = directory_ / ("measured" + std::to_string(workers.size()));
    run_result result =
        troupe("train " + two_stage_job().string() +
               " --set parallelism.partition=measured --quiet --out " + out.string() + workers);
    ASSERT_EQ(result.status, 0) << workers << "\n" << result.errors;
    const std::string line = partition_line(result.output);
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match,
                                 std::regex(R"(partition \(measured\): stages \[0,([1-4])\) )"
                                            R"(\[\1,5\); predicted share ([0-9.]+)%, ([0-9.]+)%)")))
        << workers << "\n"
        << result.output;
    EXPECT_NEAR(std::stod(match[2]) + std::stod(match[3]), 100.0, 0.11) << line;
    // The saved config holds the chosen cut point, not "measured".
    auto config = nlohmann::json::parse(read_file(out / "config.json"));
    EXPECT_EQ(config["parallelism"]["partition"], nlohmann::json::array({std::stoi(match[1])}))
        << config["parallelism"].dump();
    auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
    EXPECT_EQ(summary["steps"], 8) << workers;
  }
}

TEST_F(PartitionCliTest, MeasuredCutsInsideALayerWhereWholeBlocksCannotBalanceTwoStages) {
  const std::string job = wide_job().string();
  const std::regex chosen(R"(partition \(measured\): stages \[0,([0-9]+:[0-9]+)\) \[\1,7\); )"
                          R"(predicted share ([0-9.]+)%, ([0-9.]+)% \(whole blocks: ([0-9.]+)%, )"
                          R"(([0-9.]+)%\))");
  for (const std::string workers : {"", " --workers 2"}) {
    const fs::path out = directory_ / ("wide" + std::to_string(workers.size()));
    run_result result = troupe("train " + job + " --quiet --out " + out.string() + workers);
    ASSERT_EQ(result.status, 0) << workers << "\n" << result.errors;
    const std::string line = partition_line(result.output);
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, chosen)) << result.output;
    // What the run decided: it cut inside a layer because, under one timing of the cut
    // model, the cut's largest stage share is below that of the best whole-block partition.
    // How far below depends on the machine's load while timing (about 50 % against 80 % when
    // it is quiet), which `troupe train` prints and no test asserts.
    const double cut_share = std::max(std::stod(match[2]), std::stod(match[3]));
    const double whole_share = std::max(std::stod(match[4]), std::stod(match[5]));
    EXPECT_LT(cut_share, whole_share) << line;
    EXPECT_NEAR(std::stod(match[2]) + std::stod(match[3]), 100.0, 0.11) << line;
    EXPECT_NEAR(std::stod(match[4]) + std::stod(match[5]), 100.0, 0.11) << line;
    // The saved job writes the layer whole and the cut as "block:row".
    auto config = nlohmann::json::parse(read_file(out / "config.json"));
    EXPECT_EQ(config["parallelism"]["partition"], nlohmann::json::array({match[1].str()}));
    ASSERT_EQ(config["model"]["layers"].size(), 7u);
    const size_t block = std::stoul(match[1].str());
    EXPECT_EQ(config["model"]["layers"][block]["out"], 4096) << config["model"].dump();
    auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
    EXPECT_EQ(summary["steps"], 4) << workers;
    // `troupe inspect` numbers the checkpoint's stages as the job file does.
    const run_result inspected = troupe("inspect " + out.string());
    ASSERT_EQ(inspected.status, 0) << inspected.errors;
    EXPECT_NE(inspected.output.find("stage 0: blocks [0, " + match[1].str() + "), "),
              std::string::npos)
        << inspected.output;
    EXPECT_NE(inspected.output.find("stage 1: blocks [" + match[1].str() + ", 7), "),
              std::string::npos)
        << inspected.output;
    // A resumed run keeps the cut, so that its checkpoints fit.
    result = troupe("train " + job + " --set training.epochs=2 --resume --quiet --out " +
                    out.string() + workers);
    ASSERT_EQ(result.status, 0) << workers << "\n" << result.errors;
    EXPECT_NE(result.errors.find("resuming from"), std::string::npos) << result.errors;
    EXPECT_NE(partition_line(result.output).find("measured, as in"), std::string::npos)
        << result.output;
    EXPECT_NE(partition_line(result.output).find("[0," + match[1].str() + ")"), std::string::npos)
        << result.output;
    summary = nlohmann::json::parse(read_file(out / "summary.json"));
    EXPECT_EQ(summary["steps"], 8) << workers;
  }
}

TEST_F(PartitionCliTest, SimulateCutsMeasuredInsideALayerByTheEstimate) {
  const std::string cluster =
      std::string(TROUPE_SOURCE_DIR) + "/apps/examples/cluster_this_machine.toml";
  const fs::path out = directory_ / "simulated";
  run_result result = troupe("simulate " + wide_job().string() + " --cluster " + cluster +
                             " --sweep parallelism.partition=balanced,measured --set "
                             "parallelism.mode=async --set data.synthetic_train=12800 --set "
                             "checkpoint.interval_steps=0 --out " +
                             out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
  const nlohmann::json runs = summary["sweep"]["runs"];
  ASSERT_EQ(runs.size(), 2u) << summary.dump();
  // Balanced async stages keep both cores busier: the same job in less simulated time.
  const auto least_used = [](const nlohmann::json& run) {
    const std::vector<double> use = run["stage_utilization"].get<std::vector<double>>();
    return *std::min_element(use.begin(), use.end());
  };
  EXPECT_GT(runs[1]["samples_per_s"].get<double>(), 1.05 * runs[0]["samples_per_s"].get<double>())
      << runs.dump();
  EXPECT_GT(least_used(runs[1]), least_used(runs[0])) << runs.dump();
}

TEST_F(PartitionCliTest, EveryPartitionPrintsItsStagesAndShares) {
  const std::string job = two_stage_job().string();
  run_result result = troupe("train " + job + " --quiet --out " + (directory_ / "a").string());
  ASSERT_EQ(result.status, 0) << result.errors;
  // The estimate: the 8x16 layer without its input gradient, the 16x16 and 16x4 layers with.
  EXPECT_EQ(partition_line(result.output).rfind("partition (balanced): stages [0,2) [2,5); ", 0),
            0u)
      << result.output;
  result = troupe("train " + job + " --set parallelism.partition=[4] --quiet --out " +
                  (directory_ / "b").string());
  ASSERT_EQ(result.status, 0) << result.errors;
  EXPECT_EQ(partition_line(result.output).rfind("partition (cut points): stages [0,4) [4,5); ", 0),
            0u)
      << result.output;
}

TEST_F(PartitionCliTest, BalancedSaysWhenCuttingInsideLayersWouldBalanceBetter) {
  // 784-256-4096-64-4 on 2 stages: whole blocks leave one stage most of the work.
  const fs::path out = directory_ / "hinted";
  run_result result = troupe("train " + wide_job().string() +
                             " --set parallelism.partition=balanced --quiet --out " + out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  const std::regex hint(R"(troupe: cutting inside layers would lower the largest stage's )"
                        R"(predicted share from ([0-9.]+)% to ([0-9.]+)%: )"
                        R"(parallelism.partition = (\["2:[0-9]+"\]) \(or "measured", )");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(result.errors, match, hint)) << result.errors;
  EXPECT_GT(std::stod(match[1]) - std::stod(match[2]), 5.0) << match[0];
  // The cut points it names are written as a job file takes them, and do what it says.
  result =
      troupe("train " + wide_job().string() + " --set 'parallelism.partition=" + match[3].str() +
             "' --quiet --out " + (directory_ / "cut").string());
  ASSERT_EQ(result.status, 0) << result.errors;
  const std::string line = partition_line(result.output);
  EXPECT_EQ(line.rfind("partition (cut points): stages [0,2:", 0), 0u) << line;
  EXPECT_EQ(result.errors.find("cutting inside layers"), std::string::npos) << result.errors;
  // `troupe simulate` says so too.
  const std::string cluster =
      std::string(TROUPE_SOURCE_DIR) + "/apps/examples/cluster_this_machine.toml";
  result =
      troupe("simulate " + wide_job().string() + " --cluster " + cluster +
             " --set parallelism.partition=balanced --out " + (directory_ / "simulated").string());
  ASSERT_EQ(result.status, 0) << result.errors;
  EXPECT_NE(result.errors.find("cutting inside layers would lower"), std::string::npos)
      << result.errors;
  // A partition that whole blocks balance gets no such line.
  result = troupe("train " + two_stage_job().string() + " --quiet --out " +
                  (directory_ / "small").string());
  ASSERT_EQ(result.status, 0) << result.errors;
  EXPECT_EQ(result.errors.find("cutting inside layers"), std::string::npos) << result.errors;
}

TEST_F(PartitionCliTest, AnUnknownPartitionIsOneLineListingTheChoices) {
  run_result result =
      troupe("train " + two_stage_job().string() + " --set parallelism.partition=fastest");
  EXPECT_EQ(result.status, 2);
  EXPECT_NE(result.errors.find("parallelism.partition must be \"balanced\", \"measured\", "
                               "\"uniform\" or an array of cut points"),
            std::string::npos)
      << result.errors;
}

}  // namespace
