// `troupe train` chooses the partition once, prints it with each stage's predicted share, and
// trains with the chosen cut points in every process.

#include <gtest/gtest.h>

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
