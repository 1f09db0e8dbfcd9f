// `troupe converge` races settings of a job to its target accuracy over seeds, counts the runs
// that diverge instead of hiding them, and simulates each run beside it.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/cli_helpers.h"

namespace {

namespace fs = std::filesystem;

using namespace troupe::testing;

class ConvergeCliTest : public troupe_command_test {
 protected:
  /// The 8-16-16-4 MLP on 2 async stages, two short epochs, racing to `target`.
  fs::path job(double target) {
    return write("race.toml", mlp_model("relu", "tanh") + synthetic_data(512, 128) + R"(
[parallelism]
stages = 2
mode = "async"
[training]
batch_size = 32
epochs = 2
lr = 0.1
momentum = 0.9
target_accuracy = )" + std::to_string(target) +
                                  "\n");
  }
};

TEST_F(ConvergeCliTest, RacesTheSettingsOverSeedsCountingDivergedRuns) {
  const fs::path out = directory_ / "race";
  const run_result result =
      troupe("converge " + job(0.3).string() +
             " --sweep parallelism.staleness_correction='\"none\"','\"pipemare\"' --setting "
             "'exploding:training.lr=1e30' --seeds 2 --seconds 0.01 --out " +
             out.string());
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  for (const char* row : {"\nnone ", "\npipemare ", "\nexploding "}) {
    EXPECT_NE(result.output.find(row), std::string::npos) << row << "\n" << result.output;
  }
  std::ifstream file(out / "convergence.json");
  const nlohmann::json table = nlohmann::json::parse(file, nullptr, false);
  ASSERT_TRUE(table.is_array()) << result.output;
  ASSERT_EQ(table.size(), 3u);
  for (const nlohmann::json& row : table) {
    ASSERT_EQ(row["runs"].size(), 2u) << row.dump();
    ASSERT_EQ(row["predicted"].size(), 2u) << row.dump();
    const bool exploding = row["setting"] == "exploding";
    for (const char* side : {"runs", "predicted"}) {
      for (const nlohmann::json& run : row[side]) {
        EXPECT_EQ(run["diverged"].get<bool>(), exploding) << side << " " << row.dump();
        if (!exploding) {
          EXPECT_TRUE(run["time_to_target_s"].is_number()) << side << " " << row.dump();
          EXPECT_GT(run["final_test_accuracy"].get<double>(), 0.3) << side << " " << row.dump();
        }
      }
    }
  }
  // Each run kept its own output, seeds 1 and 2.
  EXPECT_TRUE(fs::exists(out / "pipemare-seed2" / "summary.json"));
  EXPECT_TRUE(fs::exists(out / "exploding-seed1" / "train.log"));
}

TEST_F(ConvergeCliTest, RefusesAJobWithoutATargetAndAMalformedSetting) {
  run_result result = troupe("converge " + job(0).string() + " --seeds 1");
  EXPECT_EQ(result.status, 2) << result.errors;
  EXPECT_NE(result.errors.find("training.target_accuracy is not set"), std::string::npos)
      << result.errors;
  result = troupe("converge " + job(0.5).string() + " --setting 'nocolon' --seeds 1");
  EXPECT_EQ(result.status, 2) << result.errors;
  EXPECT_NE(result.errors.find("--setting nocolon: expected NAME:KEY=VALUE"), std::string::npos)
      << result.errors;
  result = troupe("converge " + job(0.5).string() + " --setting 'x:parallelism.mode=\"both\"'");
  EXPECT_EQ(result.status, 2) << result.errors;
  EXPECT_NE(result.errors.find("setting x: "), std::string::npos) << result.errors;
  EXPECT_NE(result.errors.find("parallelism.mode"), std::string::npos) << result.errors;
}

}  // namespace
