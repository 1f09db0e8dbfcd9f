// `troupe converge` races settings of a job to its target accuracy over seeds, counts the runs
// that diverge instead of hiding them, calibrates each run's setting beside it, and simulates
// every run from its calibration once the race is over.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>

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
             "'exploding:training.lr=1e38' --setting 'halves:parallelism.micro_batches=2' --seeds "
             "2 --seconds 0.01 --out " +
             out.string());
  ASSERT_EQ(result.status, 0) << result.output << result.errors;
  for (const char* row : {"\nnone ", "\npipemare ", "\nexploding ", "\nhalves "}) {
    EXPECT_NE(result.output.find(row), std::string::npos) << row << "\n" << result.output;
  }
  // Each run's outcome as it ends; once the last run is over, the simulations, as many side by
  // side as fill the job's threads (2 stages of threads / 2 each), and each prediction as it ends.
  EXPECT_NE(result.output.find("[seed 2] exploding            diverged\n"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("[seed 2] exploding            predicted: diverged (simulated in "),
            std::string::npos)
      << result.output;
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int side_by_side = std::min(8, threads / std::max(1, threads / 2));
  const size_t simulating =
      result.output.find("simulating the 8 runs, " + std::to_string(side_by_side) + " at a time\n");
  ASSERT_NE(simulating, std::string::npos) << side_by_side << "\n" << result.output;
  EXPECT_LT(result.output.rfind("predicting from the calibration"), simulating) << result.output;
  size_t predictions = 0;
  for (size_t at = result.output.find("predicted: "); at != std::string::npos;
       at = result.output.find("predicted: ", at + 1)) {
    EXPECT_GT(at, simulating) << result.output;
    ++predictions;
  }
  EXPECT_EQ(predictions, 8u) << result.output;  // 4 settings × 2 seeds
  EXPECT_NE(result.errors.find("[seed 1] simulating halves with its calibration"),
            std::string::npos)
      << result.errors;
  std::ifstream file(out / "convergence.json");
  const nlohmann::json table = nlohmann::json::parse(file, nullptr, false);
  ASSERT_TRUE(table.is_array()) << result.output;
  ASSERT_EQ(table.size(), 4u);
  for (const nlohmann::json& row : table) {
    ASSERT_EQ(row["runs"].size(), 2u) << row.dump();
    ASSERT_EQ(row["predicted"].size(), 2u) << row.dump();
    const bool exploding = row["setting"] == "exploding";
    for (const char* side : {"runs", "predicted"}) {
      for (const nlohmann::json& run : row[side]) {
        EXPECT_EQ(run["diverged"].get<bool>(), exploding) << side << " " << row.dump();
        if (!exploding) {
          EXPECT_TRUE(run["time_to_target_s"].is_number()) << side << " " << row.dump();
          EXPECT_GT(run["steps_to_target"].get<int64_t>(), 0) << side << " " << row.dump();
          EXPECT_GT(run["final_test_accuracy"].get<double>(), 0.3) << side << " " << row.dump();
          // Both sides report how stale the backward passes were, for comparing them.
          ASSERT_TRUE(run["mean_staleness"].is_number()) << side << " " << row.dump();
          EXPECT_GE(run["mean_staleness"].get<double>(), 0.0) << side << " " << row.dump();
        }
      }
    }
  }
  // Each run was calibrated at its setting's own micro-batch size just before and just after
  // it, and predicted from the calibration whose passes varied less.
  for (const auto& [name, batch] : {std::pair{"none", 32}, std::pair{"halves", 16}}) {
    for (const char* seed : {"1", "2"}) {
      std::map<std::string, double> jitter;
      for (const char* when : {"before", "after"}) {
        std::ifstream profile(
            out / ("profile-" + std::string(name) + "-seed" + seed + "-" + when + ".json"));
        const nlohmann::json calibrated = nlohmann::json::parse(profile, nullptr, false);
        ASSERT_TRUE(calibrated.is_object()) << name << " seed " << seed << " " << when;
        EXPECT_EQ(calibrated["batch"], batch) << name << " seed " << seed << " " << when;
        jitter[when] = calibrated["work_jitter"].get<double>();
      }
      const std::string used = jitter["after"] < jitter["before"] ? "after" : "before";
      std::smatch line;
      ASSERT_TRUE(
          std::regex_search(result.output, line,
                            std::regex("\\[seed " + std::string(seed) + "\\] " + name +
                                       " +predicting from the calibration (before|after) the run")))
          << result.output;
      EXPECT_EQ(line[1], used) << name << " seed " << seed << ": " << jitter["before"] << " "
                               << jitter["after"];
    }
  }
  const size_t calibrating = result.output.find("[seed 2] calibrating this machine for halves");
  ASSERT_NE(calibrating, std::string::npos) << result.output;
  EXPECT_LT(calibrating, result.output.find("[seed 2] halves "));
  EXPECT_NE(result.output.find("[seed 2] calibrating this machine for halves, after its run"),
            std::string::npos)
      << result.output;
  // How the prediction ranks the settings that reached the target (exploding did not): at most
  // 3 pairs (fewer where two medians tie).
  std::smatch ranking;
  ASSERT_TRUE(std::regex_search(result.output, ranking,
                                std::regex("ranking: the prediction orders ([0-9]+) of ([0-9]+) "
                                           "pairs of settings as measured; ([0-9]+) of the "
                                           "([0-9]+) pairs whose middle runs do not overlap")))
      << result.output;
  EXPECT_LE(std::stoi(ranking[1]), std::stoi(ranking[2]));
  EXPECT_LE(std::stoi(ranking[2]), 3);
  EXPECT_LE(std::stoi(ranking[3]), std::stoi(ranking[4]));
  EXPECT_LE(std::stoi(ranking[4]), std::stoi(ranking[2]));
  // Each run kept its own output, seeds 1 and 2.
  EXPECT_TRUE(fs::exists(out / "pipemare-seed2" / "summary.json"));
  EXPECT_TRUE(fs::exists(out / "exploding-seed1" / "train.log"));
}

TEST_F(ConvergeCliTest, CountsARunThatFailsApartAndExitsWithAnError) {
  // The data directory is read only by the run, so the setting loads but its runs fail.
  const fs::path out = directory_ / "race";
  const run_result result = troupe(
      "converge " + job(0.3).string() +
      " --setting 'missing:data.dataset=\"fashion-mnist\",data.path=\"" +
      (directory_ / "nowhere").string() + "\"' --seeds 1 --no-prediction --out " + out.string());
  EXPECT_EQ(result.status, 1) << result.output << result.errors;
  EXPECT_NE(result.errors.find("1 run failed (not counted in the medians)"), std::string::npos)
      << result.errors;
  std::ifstream file(out / "convergence.json");
  const nlohmann::json table = nlohmann::json::parse(file, nullptr, false);
  ASSERT_TRUE(table.is_array()) << result.output;
  ASSERT_EQ(table.size(), 1u);
  const nlohmann::json& run = table[0]["runs"][0];
  EXPECT_TRUE(run["failed"].get<bool>()) << run.dump();
  EXPECT_FALSE(run["diverged"].get<bool>()) << run.dump();
}

TEST_F(ConvergeCliTest, GoesOnWithoutThePredictionWhenACalibrationFails) {
  // The first setting's data cannot be read, so its calibration fails before its run: the race
  // goes on, and the table gives what the runs measured, without a prediction.
  const fs::path out = directory_ / "race";
  const run_result result =
      troupe("converge " + job(0.3).string() +
             " --setting 'missing:data.dataset=\"fashion-mnist\",data.path=\"" +
             (directory_ / "nowhere").string() +
             "\"' --setting 'plain:parallelism.staleness_correction=\"none\"' --seeds 1 --seconds "
             "0.01 --out " +
             out.string());
  EXPECT_EQ(result.status, 1) << result.output << result.errors;
  EXPECT_NE(result.errors.find("calibration for missing failed: "), std::string::npos)
      << result.errors;
  EXPECT_NE(result.errors.find("the race goes on without the prediction"), std::string::npos)
      << result.errors;
  // Both are reported at the end: the prediction that stopped and the run that failed.
  EXPECT_NE(result.errors.find("no prediction: calibration for missing failed: "),
            std::string::npos)
      << result.errors;
  EXPECT_NE(result.errors.find("1 run failed (not counted in the medians)"), std::string::npos)
      << result.errors;
  EXPECT_NE(result.output.find("[seed 1] plain                target after "), std::string::npos)
      << result.output;
  EXPECT_EQ(result.output.find("predicted to target s"), std::string::npos) << result.output;
  std::ifstream file(out / "convergence.json");
  const nlohmann::json table = nlohmann::json::parse(file, nullptr, false);
  ASSERT_TRUE(table.is_array()) << result.output;
  ASSERT_EQ(table.size(), 2u);
  EXPECT_TRUE(table[0]["runs"][0]["failed"].get<bool>()) << table.dump();
  EXPECT_TRUE(table[1]["runs"][0]["time_to_target_s"].is_number()) << table.dump();
  EXPECT_FALSE(table[1].contains("predicted")) << table.dump();
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
