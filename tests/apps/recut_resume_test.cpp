// A checkpoint resumed by a job cut into another number of stages, and run by another number of
// replicas: the run goes on to the weights of the uninterrupted one.

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "tests/support/cli_helpers.h"

namespace {

using namespace troupe::testing;
using json = nlohmann::json;

/// The float32 tensors of a safetensors file by name without its "stageN." prefix; the parts of
/// a layer that stages share are joined in stage order.
std::map<std::string, std::vector<float>> read_weights(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(file), {}};
  std::map<std::string, std::vector<float>> weights;
  if (bytes.size() < 8) return weights;
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  const json header = json::parse(bytes.substr(8, header_bytes));
  for (const auto& [name, entry] : header.items()) {  // sorted: stage0 before stage1
    if (name == "__metadata__") continue;
    const uint64_t begin = entry["data_offsets"][0], end = entry["data_offsets"][1];
    std::vector<float> values((end - begin) / sizeof(float));
    std::memcpy(values.data(), bytes.data() + 8 + header_bytes + begin, end - begin);
    std::vector<float>& whole = weights[name.substr(name.find('.') + 1)];
    whole.insert(whole.end(), values.begin(), values.end());
  }
  return weights;
}

class RecutResumeTest : public troupe_command_test {
 protected:
  /// A 4-stage sync job with Adam and a checkpoint every 8 steps (16 steps an epoch).
  fs::path four_stage_job() { return write("four.toml", checkpointed_sync_job(4)); }

  std::map<std::string, std::vector<float>> exported(const fs::path& run, int step) {
    const fs::path file = directory_ / (run.filename().string() + ".safetensors");
    const run_result exporting =
        troupe("export " + (run / "checkpoints" / ("step-" + std::to_string(step))).string() + " " +
               file.string() + " --format safetensors");
    EXPECT_EQ(exporting.status, 0) << exporting.errors;
    return read_weights(file);
  }
};

/// Each tensor's difference from `expected`'s as a fraction of its norm: the largest.
double largest_relative_difference(const std::map<std::string, std::vector<float>>& expected,
                                   const std::map<std::string, std::vector<float>>& actual) {
  double largest = 0;
  for (const auto& [name, values] : expected) {
    const auto found = actual.find(name);
    if (found == actual.end() || found->second.size() != values.size()) return INFINITY;
    double difference = 0, norm = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      difference += std::pow(static_cast<double>(found->second[i]) - values[i], 2);
      norm += std::pow(static_cast<double>(values[i]), 2);
    }
    largest = std::max(largest, std::sqrt(difference / std::max(norm, 1e-30)));
  }
  return largest;
}

TEST_F(RecutResumeTest, AFourStageSyncCheckpointGoesOnAsTwoStagesAndAsTwoStagesOfTwoReplicas) {
  const std::string job = four_stage_job().string();
  const fs::path whole = directory_ / "whole";
  const run_result uninterrupted = troupe("train " + job + " --quiet --out " + whole.string());
  ASSERT_EQ(uninterrupted.status, 0) << uninterrupted.errors;
  const auto expected = exported(whole, 32);
  ASSERT_EQ(expected.size(), 6u);  // three linear layers' weights and biases
  for (const std::string& layout :
       {std::string(" --set parallelism.stages=2"), std::string(" --set parallelism.stages=2 --set "
                                                                "parallelism.replicas=2")}) {
    const fs::path parts = directory_ / (layout.size() > 30 ? "replicas" : "stages");
    const run_result first =
        troupe("train " + job + " --set training.epochs=1 --quiet --out " + parts.string());
    ASSERT_EQ(first.status, 0) << first.errors;
    const run_result rest =
        troupe("train " + job + layout + " --resume --quiet --out " + parts.string());
    ASSERT_EQ(rest.status, 0) << rest.errors;
    EXPECT_NE(rest.errors.find("cutting the checkpoint's 4 stages into this job's 2"),
              std::string::npos)
        << rest.errors;
    const json manifest =
        json::parse(read_file(parts / "checkpoints" / "step-32" / "manifest.json"));
    EXPECT_EQ(manifest["stages"], 2);
    const auto resumed = exported(parts, 32);
    if (layout.size() < 30) {
      // The same sums in the same order on other stages: the very weights.
      EXPECT_EQ(resumed, expected) << layout;
    } else {
      // Two replicas sum each batch's gradient in two halves: float rounding, no more.
      EXPECT_LE(largest_relative_difference(expected, resumed), 1e-6) << layout;
    }
    // The resumed half moved the weights: they are not the checkpoint's of step 16.
    EXPECT_NE(exported(parts, 16).at("linear0.weight"), resumed.at("linear0.weight"));
  }
}

}  // namespace
