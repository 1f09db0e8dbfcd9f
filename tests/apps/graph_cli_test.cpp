// Dynamic models from the command line: a sync run of a Tree-LSTM on ListOps, and of an LSTM
// and a GPT over whole fortunes, in one process and with each stage in a worker process of its own,
// ends with the weights of the graph oracle (every instance run alone).

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/engine/graph_oracle.h"
#include "actors/storage/safetensors.h"
#include "layers/backend_registry.h"
#include "tests/support/cli_helpers.h"

namespace fs = std::filesystem;

namespace troupe::actors {
namespace {

using troupe::testing::run_result;

const char* const kTreeJob = R"([[model.nodes]]
name = "embed"
layers = [{ type = "embedding", vocab = 16, dim = 8 }]
next = "cell"

[[model.nodes]]
name = "cell"
layers = [{ type = "tree_lstm_cell", out = 8, arity = 2 }]
route = "tree"
emit = "root"
next = "head"

[[model.nodes]]
name = "head"
layers = [{ type = "linear", out = 10 }]

[data]
dataset = "listops"
max_depth = 3
synthetic_train = 96
synthetic_test = 16

[training]
batch_size = 8
epochs = 1
max_steps = 8
optimizer = "adam"
lr = 0.01
)";

const char* const kSequenceJob = R"([[model.nodes]]
name = "embed"
layers = [{ type = "embedding", vocab = 256, dim = 8 }]
next = "cell"

[[model.nodes]]
name = "cell"
layers = [{ type = "lstm_cell", out = 8 }]
route = "loop"
next = "head"

[[model.nodes]]
name = "head"
layers = [{ type = "linear", out = 256 }]

[data]
dataset = "text-records"
context = 48
train_samples = 64
test_samples = 8

[training]
batch_size = 8
epochs = 1
max_steps = 8
lr = 0.1
)";

/// A GPT over whole fortunes: attention within each fortune, positions counted in each. (Plain
/// SGD: the gradient of a key's bias is zero but for rounding, which Adam would scale up to
/// steps of lr.)
const char* const kGptJob = R"([[model.nodes]]
name = "embed"
layers = [
  { type = "embedding", vocab = 256, dim = 16, positions = 48 },
  { type = "transformer_block", heads = 2 },
]
next = "top"

[[model.nodes]]
name = "top"
layers = [
  { type = "transformer_block", heads = 2 },
  { type = "layernorm" },
  { type = "lm_head", vocab = 256 },
]

[data]
dataset = "text-records"
context = 48
train_samples = 64
test_samples = 8

[training]
batch_size = 8
epochs = 1
max_steps = 8
lr = 0.1
)";

class GraphCliTest : public troupe::testing::troupe_command_test {
 protected:
  fs::path write_job(const std::string& name, const std::string& text) {
    const fs::path path = directory_ / (name + ".toml");
    std::ofstream(path) << text << "\n[checkpoint]\ninterval_steps = 8\n";
    return path;
  }

  /// The oracle's weights after the job's steps, by parameter name.
  std::map<std::string, std::vector<float>> oracle_weights(const fs::path& job,
                                                           const std::vector<std::string>& sets) {
    job_error problem;
    auto config = load_job_file(job.string(), sets, &problem);
    EXPECT_TRUE(config.has_value()) << problem.message;
    std::string error;
    auto data = load_job_data(*config, &error);
    EXPECT_TRUE(data.has_value()) << error;
    auto device = layers::create_backend("cpu", 1, &error);
    graph_oracle oracle(*config, *device);
    oracle.train(data->train, config->training.max_steps);
    std::map<std::string, std::vector<float>> weights;
    const std::vector<std::string> names = oracle.parameter_names();
    const std::vector<layers::parameter*> parameters = oracle.parameters();
    for (size_t i = 0; i < names.size(); ++i)
      weights[names[i]] = parameters[i]->value.to_host(oracle.work_stream());
    return weights;
  }

  /// Trains `job` with `arguments`, exports its last checkpoint and compares every weight with
  /// the oracle's (relative to the tensor's largest value).
  void expect_equals_oracle(const fs::path& job, const std::vector<std::string>& sets,
                            const std::string& arguments) {
    std::string set_text;
    for (const std::string& set : sets) set_text += " --set " + set;
    const fs::path run = directory_ / ("run" + std::to_string(runs_++));
    run_result trained =
        troupe("train " + job.string() + set_text + " --quiet --out " + run.string() + arguments);
    ASSERT_EQ(trained.status, 0) << trained.errors;
    const fs::path file = run / "weights.safetensors";
    run_result exported =
        troupe("export " + (run / "checkpoints" / "step-8").string() + " " + file.string());
    ASSERT_EQ(exported.status, 0) << exported.errors;
    std::string error;
    auto tensors = read_safetensors(file.string(), &error);
    ASSERT_TRUE(tensors.has_value()) << error;
    const auto expected = oracle_weights(job, sets);
    ASSERT_EQ(tensors->size(), expected.size()) << arguments;
    for (const named_tensor& tensor : *tensors) {
      // The export names each tensor "stage{s}.{name}".
      auto found = expected.find(tensor.name.substr(tensor.name.find('.') + 1));
      ASSERT_NE(found, expected.end()) << tensor.name;
      ASSERT_EQ(found->second.size(), tensor.values.size()) << tensor.name;
      double scale = 0, difference = 0;
      for (size_t i = 0; i < tensor.values.size(); ++i) {
        scale = std::max(scale, std::fabs(static_cast<double>(found->second[i])));
        difference = std::max(difference,
                              std::fabs(static_cast<double>(tensor.values[i]) - found->second[i]));
      }
      EXPECT_LE(difference, 1e-5 * scale) << tensor.name << arguments << " " << set_text;
    }
  }

  int runs_ = 0;
};

TEST_F(GraphCliTest, SyncTreeLstmEqualsTheOracleInOneProcessAndAcrossWorkers) {
  const fs::path job = write_job("tree", kTreeJob);
  const std::vector<std::string> two_stages{"parallelism.stages=2", "parallelism.micro_batches=2",
                                            "parallelism.partition=uniform"};
  expect_equals_oracle(job, two_stages, "");
  expect_equals_oracle(job, two_stages, " --workers 2");
}

TEST_F(GraphCliTest, SyncLstmOverWholeFortunesEqualsTheOracleInOneProcessAndAcrossWorkers) {
  if (!fs::exists("/usr/share/games/fortunes")) GTEST_SKIP() << "no fortunes (Debian: fortunes)";
  const fs::path job = write_job("sequence", kSequenceJob);
  const std::vector<std::string> three_stages{"parallelism.stages=3", "parallelism.micro_batches=4",
                                              "parallelism.partition=uniform"};
  expect_equals_oracle(job, three_stages, "");
  expect_equals_oracle(job, three_stages, " --workers 3");
}

TEST_F(GraphCliTest, ASyncGraphRunResumedFromItsCheckpointEndsWithTheSameWeights) {
  const fs::path job = directory_ / "resume.toml";
  std::ofstream(job) << kTreeJob << "\n[checkpoint]\ninterval_steps = 4\n";
  const std::string sets =
      " --set parallelism.stages=2 --set parallelism.micro_batches=2 --set training.max_steps=8"
      " --quiet --out ";
  const fs::path whole = directory_ / "whole", resumed = directory_ / "resumed";
  ASSERT_EQ(troupe("train " + job.string() + sets + whole.string()).status, 0);
  // The same run, stopped after its step-4 checkpoint: resumed from there.
  fs::copy(whole, resumed, fs::copy_options::recursive);
  fs::remove_all(resumed / "checkpoints" / "step-8");
  std::ofstream(resumed / "checkpoints" / "latest") << "step-4\n";
  run_result again = troupe("train " + job.string() + sets + resumed.string() + " --resume");
  ASSERT_EQ(again.status, 0) << again.errors;
  for (const fs::path& run : {whole, resumed}) {
    ASSERT_EQ(troupe("export " + (run / "checkpoints" / "step-8").string() + " " +
                     (run / "weights.safetensors").string())
                  .status,
              0);
  }
  EXPECT_EQ(troupe::testing::read_file(whole / "weights.safetensors"),
            troupe::testing::read_file(resumed / "weights.safetensors"));
}

TEST_F(GraphCliTest, AMeasuredPartitionTimesTheNodesAndItsWorkersReadTheCutPoints) {
  const fs::path job = write_job("measured", kTreeJob);
  const fs::path run = directory_ / "measured";
  run_result trained = troupe("train " + job.string() +
                              " --workers 2 --set parallelism.stages=2"
                              " --set parallelism.partition=measured --out " +
                              run.string());
  ASSERT_EQ(trained.status, 0) << trained.errors;
  const std::string said = trained.output + trained.errors;
  EXPECT_NE(said.find("partition (measured): stages [embed"), std::string::npos) << said;
  // The nodes' timed costs chose a cut between nodes; the run's config.json holds it as a node
  // index, which the worker processes read back.
  const nlohmann::json written =
      nlohmann::json::parse(troupe::testing::read_file(run / "config.json"));
  const nlohmann::json& cuts = written["parallelism"]["partition"];
  EXPECT_TRUE(cuts == nlohmann::json::array({1}) || cuts == nlohmann::json::array({2}))
      << cuts.dump();
  // A resumed run keeps those cut points instead of timing again.
  run_result resumed = troupe("train " + job.string() +
                              " --set parallelism.stages=2 --set parallelism.partition=measured"
                              " --set training.max_steps=10 --resume --out " +
                              run.string());
  ASSERT_EQ(resumed.status, 0) << resumed.errors;
  EXPECT_NE((resumed.output + resumed.errors).find("partition (measured, as in "),
            std::string::npos)
      << resumed.output + resumed.errors;
}

TEST_F(GraphCliTest, AGraphTakesCutPointsBetweenNodes) {
  const fs::path job = write_job("cut", kTreeJob);
  run_result trained = troupe("train " + job.string() +
                              " --set parallelism.stages=2 --set parallelism.partition=[2] --out " +
                              (directory_ / "cut").string());
  ASSERT_EQ(trained.status, 0) << trained.errors;
  EXPECT_NE((trained.output + trained.errors)
                .find("partition (cut points): stages [embed cell] "
                      "[head]"),
            std::string::npos)
      << trained.output + trained.errors;
}

TEST_F(GraphCliTest, SyncGptOverWholeFortunesEqualsTheOracleInOneProcessAndAcrossWorkers) {
  if (!fs::exists("/usr/share/games/fortunes")) GTEST_SKIP() << "no fortunes (Debian: fortunes)";
  const fs::path job = write_job("gpt", kGptJob);
  const std::vector<std::string> two_stages{"parallelism.stages=2", "parallelism.micro_batches=2"};
  expect_equals_oracle(job, two_stages, "");
  expect_equals_oracle(job, two_stages, " --workers 2");
}

TEST_F(GraphCliTest, AnAsyncTreeLstmLearnsListOpsAcrossStages) {
  std::string text = kTreeJob;
  text.replace(text.find("dim = 8"), 7, "dim = 16");
  text.replace(text.find("out = 8, arity"), 14, "out = 32, arity");
  const fs::path job = write_job("learn", text);
  const fs::path run = directory_ / "learn";
  run_result trained = troupe(
      "train " + job.string() +
      " --set parallelism.stages=2 --set parallelism.mode=async --set parallelism.max_active_keys=2"
      " --set training.max_steps=0 --set training.epochs=8 --set training.batch_size=16"
      " --set data.synthetic_train=1024 --set data.synthetic_test=256 --set data.max_depth=2"
      " --quiet --out " +
      run.string());
  ASSERT_EQ(trained.status, 0) << trained.errors;
  const std::string summary = troupe::testing::read_file(run / "summary.json");
  const auto at = summary.find("\"final_test_accuracy\":");
  ASSERT_NE(at, std::string::npos) << summary;
  // Ten classes: chance is 0.1, the most common value of these lists about 0.2.
  EXPECT_GT(std::stod(summary.substr(at + 22)), 0.4) << summary;
  // Staleness is reported by node: each stage names the nodes that share its weights' versions.
  const nlohmann::json stages = nlohmann::json::parse(summary)["stages"];
  ASSERT_EQ(stages.size(), 2u) << summary;
  EXPECT_EQ(stages[0]["nodes"], nlohmann::json::array({"embed"})) << summary;
  EXPECT_EQ(stages[1]["nodes"], nlohmann::json::array({"cell", "head"})) << summary;
  // Two keys in flight: the first stage's weights move on while a key is further down.
  EXPECT_GT(stages[0]["mean_staleness"].get<double>(), 0.0) << summary;
  EXPECT_GE(stages[1]["mean_staleness"].get<double>(), 0.0) << summary;
}

}  // namespace
}  // namespace troupe::actors
