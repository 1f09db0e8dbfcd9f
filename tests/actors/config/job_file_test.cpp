#include "actors/config/job_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "actors/engine/stage_settings.h"
#include "tests/actors/config/job_file_test_support.h"

namespace troupe::actors {
namespace {

using namespace job_file_testing;

const std::string kFull = R"(# every key, none at its default
[model]
input_shape = [1, 28, 28]
loss = "softmax_cross_entropy"
layers = [
  { type = "conv2d", out = 8, kernel = 3, stride = 2, padding = 1, bias = false },
  { type = "relu" },
  { type = "maxpool2d", kernel = 3 },
  { type = "flatten" },
  { type = "dropout", p = 0.25 },
  { type = "linear", out = 32 },
  { type = "tanh" },
  { type = "gelu" },
  { type = "linear", out = 10, bias = false },
]

[data]
dataset = "synthetic"
path = "/tmp/data"
shuffle = false
normalize = false
train_samples = 1000
test_samples = 200
synthetic_train = 4096
synthetic_test = 512
classes = 5

[parallelism]
stages = 3
partition = [3, 6]
devices = ["cpu", "cuda", "cuda:1"]
mode = "async"
schedule = "1f1b"
micro_batches = 4
max_active_keys = 6
min_update_interval = 2
max_staleness = 3
weight_stashing = true
threads = 2

[training]
batch_size = 128
epochs = 5
max_steps = 1000
optimizer = "adam"
lr = 0.001
momentum = 0.9
weight_decay = 0.0005
beta1 = 0.8
beta2 = 0.99
epsilon = 1e-6
lr_schedule = "step"
lr_decay = 0.5
lr_decay_epochs = 2
warmup_steps = 100
seed = 42
target_accuracy = 0.85
precision = "bf16"

[checkpoint]
dir = "/tmp/checkpoints"
interval_steps = 500
interval_s = 60.5
keep_last = 2

[metrics]
log_interval = 10
trace = true
progress = false
)";

TEST(JobFileTest, DefaultsFillEveryKeyNotGiven) {
  std::optional<job_config> config = parse(kMinimal);
  ASSERT_TRUE(config);
  const job_config defaults;
  ASSERT_EQ(config->model.layers.size(), 1u);
  EXPECT_EQ(config->model.layers[0].type, "linear");
  EXPECT_EQ(config->model.layers[0].out, 10);
  EXPECT_TRUE(config->model.layers[0].bias);
  EXPECT_EQ(config->model.input_shape, defaults.model.input_shape);
  EXPECT_EQ(config->data.dataset, dataset_kind::fashion_mnist);
  EXPECT_EQ(config->data.path, defaults.data.path);
  EXPECT_EQ(config->training.batch_size, 64);
  EXPECT_DOUBLE_EQ(config->training.lr, 0.01);
  EXPECT_EQ(config->training.optimizer, layers::optimizer_kind::sgd);
  EXPECT_EQ(config->training.seed, 1u);
  EXPECT_EQ(config->parallelism.stages, 1);
  EXPECT_EQ(config->parallelism.devices, std::vector<std::string>{"cpu"});
  EXPECT_EQ(config->parallelism.partition, "balanced");
  EXPECT_EQ(config->parallelism.mode, pipeline_mode::sync);
  EXPECT_EQ(config->checkpoint.keep_last, 3);
  EXPECT_EQ(config->metrics.log_interval, 100);
  // Defaults that depend on other keys are resolved: MAK = S and MUI = M.
  EXPECT_EQ(config->parallelism.max_active_keys, 1);
  EXPECT_EQ(config->parallelism.min_update_interval, 1);
}

TEST(JobFileTest, LayerDefaultsAreFilled) {
  std::optional<job_config> config = parse(
      "[model]\nlayers = [{ type = \"conv2d\", out = 4, kernel = 5 }, { type = "
      "\"maxpool2d\" }, { type = \"maxpool2d\", kernel = 3 }, { type = \"dropout\" }]");
  ASSERT_TRUE(config);
  const auto& layers = config->model.layers;
  EXPECT_EQ(layers[0].stride, 1);
  EXPECT_EQ(layers[0].padding, 0);
  EXPECT_TRUE(layers[0].bias);
  EXPECT_EQ(layers[1].kernel, 2);
  EXPECT_EQ(layers[1].stride, 2);
  EXPECT_EQ(layers[2].kernel, 3);
  EXPECT_EQ(layers[2].stride, 3);
  EXPECT_FLOAT_EQ(layers[3].probability, 0.5f);
}

TEST(JobFileTest, FullFileIsReadAndSurvivesARoundTripThroughJson) {
  std::optional<job_config> config = parse(kFull);
  ASSERT_TRUE(config);
  EXPECT_EQ(config->model.layers.size(), 9u);
  EXPECT_FALSE(config->model.layers[0].bias);
  EXPECT_EQ(config->model.layers[0].padding, 1);
  EXPECT_EQ(config->model.layers[2].stride, 3);
  EXPECT_FLOAT_EQ(config->model.layers[4].probability, 0.25f);
  EXPECT_EQ(config->data.classes, 5);
  EXPECT_EQ(config->parallelism.partition, "3,6");
  EXPECT_EQ(config->parallelism.devices, (std::vector<std::string>{"cpu", "cuda", "cuda:1"}));
  EXPECT_EQ(config->parallelism.max_active_keys, 6);
  EXPECT_EQ(config->parallelism.max_staleness, 3);
  EXPECT_DOUBLE_EQ(config->training.epsilon, 1e-6);
  EXPECT_EQ(config->training.seed, 42u);
  EXPECT_EQ(config->training.precision, layers::math_precision::bf16);
  EXPECT_DOUBLE_EQ(config->checkpoint.interval_s, 60.5);
  EXPECT_FALSE(config->metrics.progress);

  const nlohmann::json json = to_json(*config);
  std::optional<job_config> again = parse(json_to_toml(json));
  ASSERT_TRUE(again);
  EXPECT_EQ(to_json(*again), json);
  EXPECT_EQ(config_hash(*again), config_hash(*config));
}

TEST(JobFileTest, OverrideWithANumberReplacesTheFileValue) {
  std::optional<job_config> config =
      parse(kMinimal + "[training]\nlr = 0.1\n", {"training.lr=0.5", "training.batch_size=32"});
  ASSERT_TRUE(config);
  EXPECT_DOUBLE_EQ(config->training.lr, 0.5);
  EXPECT_EQ(config->training.batch_size, 32);
}

TEST(JobFileTest, OverrideThatIsNotTomlIsAString) {
  std::optional<job_config> config =
      parse(kMinimal, {"training.optimizer=adam", "data.path=/srv/fashion mnist",
                       "parallelism.mode=\"async\"", "parallelism.devices=cuda:0"});
  ASSERT_TRUE(config);
  EXPECT_EQ(config->training.optimizer, layers::optimizer_kind::adam);
  EXPECT_EQ(config->data.path, "/srv/fashion mnist");
  EXPECT_EQ(config->parallelism.mode, pipeline_mode::async);
  EXPECT_EQ(config->parallelism.devices, std::vector<std::string>{"cuda:0"});
}

TEST(JobFileTest, LayersMayBeAnArrayOfTables) {
  std::optional<job_config> config =
      parse("[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\ntype = \"linear\"\nout = 3\n");
  ASSERT_TRUE(config);
  ASSERT_EQ(config->model.layers.size(), 2u);
  EXPECT_EQ(config->model.layers[1].out, 3);
}

TEST(JobFileTest, OverrideWithAnArray) {
  std::optional<job_config> config =
      parse(kMinimal, {"model.input_shape=[3, 32, 32]", "parallelism.devices=[\"cpu\"]"});
  ASSERT_TRUE(config);
  EXPECT_EQ(config->model.input_shape, (std::vector<int64_t>{3, 32, 32}));
}

TEST(JobFileTest, OverrideWithAnArrayOfInlineTables) {
  std::optional<job_config> config = parse(
      kMinimal, {"model.layers=[{type=\"linear\",out=20},{type=\"relu\"},{type=\"linear\",out=10}]",
                 "parallelism.stages=2", "parallelism.partition=[2]"});
  ASSERT_TRUE(config);
  ASSERT_EQ(config->model.layers.size(), 3u);
  EXPECT_EQ(config->model.layers[0].out, 20);
  EXPECT_EQ(config->model.layers[1].type, "relu");
  EXPECT_EQ(config->parallelism.partition, "2");
  EXPECT_EQ(config->parallelism.max_active_keys, 2);
}

TEST(JobFileTest, OverrideCreatesAMissingSection) {
  std::optional<job_config> config =
      parse(kMinimal, {"training.epochs=3", "metrics.trace=true", "checkpoint.dir=ckpt"});
  ASSERT_TRUE(config);
  EXPECT_EQ(config->training.epochs, 3);
  EXPECT_TRUE(config->metrics.trace);
  EXPECT_EQ(config->checkpoint.dir, "ckpt");
}

TEST(JobFileTest, OverridesApplyInOrderAndMayCarryTheWholeModel) {
  std::optional<job_config> config =
      parse("", {"training.lr=0.1", "training.lr=0.2", " training.momentum = 0.5 ",
                 "model.layers=[{type=\"linear\",out=10}]", "parallelism.partition=1,2",
                 "parallelism.partition=uniform"});
  ASSERT_TRUE(config);
  EXPECT_DOUBLE_EQ(config->training.lr, 0.2);
  EXPECT_DOUBLE_EQ(config->training.momentum, 0.5);
  EXPECT_EQ(config->parallelism.partition, "uniform");
}

TEST(JobFileTest, MeasuredPartitionIsAccepted) {
  std::optional<job_config> config = parse(kMinimal, {"parallelism.partition=measured"});
  ASSERT_TRUE(config);
  EXPECT_EQ(config->parallelism.partition, "measured");
  EXPECT_EQ(to_json(*config)["parallelism"]["partition"], "measured");
}

TEST(JobFileTest, LoadReadsTheFileAndNamesAMissingOne) {
  job_error error;
  EXPECT_FALSE(load_job_file("/nonexistent/job.toml", {}, &error));
  EXPECT_EQ(error.message,
            "cannot open job file '/nonexistent/job.toml': No such file or directory");

  const std::string path =
      ::testing::TempDir() + "job_file_test_" + std::to_string(::getpid()) + ".toml";
  std::ofstream(path) << kMinimal << "[training]\nlrr = 1\n";
  EXPECT_FALSE(load_job_file(path, {}, &error));
  EXPECT_EQ(error.message, path + ": unknown key 'training.lrr'; did you mean 'training.lr'?");
  std::ofstream(path) << kMinimal;
  std::optional<job_config> config = load_job_file(path, {"training.epochs=7"}, &error);
  ASSERT_TRUE(config) << error.message;
  EXPECT_EQ(config->training.epochs, 7);
  std::remove(path.c_str());
}

TEST(JobFileTest, JsonHasEverySectionAndKey) {
  std::optional<job_config> config = parse(kFull);
  ASSERT_TRUE(config);
  const nlohmann::json json = to_json(*config);
  const std::vector<std::pair<std::string, std::set<std::string>>> expected = {
      {"model", {"layers", "input_shape", "loss", "init_from"}},
      {"data",
       {"dataset", "path", "shuffle", "normalize", "train_samples", "test_samples",
        "synthetic_train", "synthetic_test", "classes", "context", "validation_fraction"}},
      {"parallelism",
       {"stages",
        "partition",
        "devices",
        "mode",
        "schedule",
        "micro_batches",
        "max_active_keys",
        "min_update_interval",
        "max_staleness",
        "weight_stashing",
        "recompute",
        "threads",
        "spin_wait_ms",
        "virtual_stages",
        "staleness_correction",
        "correction_warmup_steps",
        "replicas",
        "replica_sync_interval",
        "replica_staleness",
        "collective"}},
      {"training",
       {"batch_size",   "epochs",    "max_steps",       "optimizer", "lr",
        "momentum",     "nesterov",  "weight_decay",    "beta1",     "beta2",
        "epsilon",      "clip_norm", "lr_schedule",     "lr_decay",  "lr_decay_epochs",
        "warmup_steps", "seed",      "target_accuracy", "precision", "eval_interval_steps"}},
      {"checkpoint",
       {"dir", "interval_steps", "interval_s", "keep_last", "max_restarts", "rejoin_timeout_s"}},
      {"metrics", {"log_interval", "trace", "progress", "stall_timeout_s"}},
  };
  ASSERT_EQ(json.size(), expected.size());
  for (const auto& [section, keys] : expected) {
    ASSERT_TRUE(json.contains(section)) << section;
    std::set<std::string> actual;
    for (const auto& [key, value] : json[section].items()) actual.insert(key);
    EXPECT_EQ(actual, keys) << section;
  }
  EXPECT_EQ(json["parallelism"]["partition"], nlohmann::json::parse("[3, 6]"));
  EXPECT_EQ(json["model"]["layers"][0],
            nlohmann::json::parse(R"({"type": "conv2d", "out": 8, "kernel": 3, "stride": 2,
                                      "padding": 1, "bias": false})"));
  EXPECT_EQ(json["model"]["layers"][4], nlohmann::json::parse(R"({"type": "dropout", "p": 0.25})"));
  EXPECT_EQ(json["training"]["lr"], 0.001);
}

TEST(JobFileTest, ConfigHashIsStableAndTracksValues) {
  const std::string hash = config_hash(*parse(kFull));
  EXPECT_EQ(hash.size(), 16u);
  EXPECT_EQ(hash.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(config_hash(*parse(kFull)), hash);
  // Spelling the same job differently (an override, a default written out) changes nothing.
  EXPECT_EQ(config_hash(*parse(kFull, {"training.lr=1e-3"})), hash);
  EXPECT_EQ(config_hash(*parse(kMinimal)), config_hash(*parse(kMinimal + "[training]\nlr = 0.01")));
  EXPECT_NE(config_hash(*parse(kFull, {"training.lr=0.002"})), hash);
  EXPECT_NE(config_hash(*parse(kFull, {"training.seed=43"})), hash);
  EXPECT_NE(config_hash(*parse(kMinimal)), config_hash(*parse(kMinimal, {"data.classes=9"})));
}

}  // namespace
}  // namespace troupe::actors
