#include "actors/config/job_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "actors/engine/stage_settings.h"

namespace troupe::actors {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

/// The smallest valid job: one layer, everything else default.
const std::string kMinimal = "[model]\nlayers = [{ type = \"linear\", out = 10 }]\n";

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

std::optional<job_config> parse(const std::string& text,
                                const std::vector<std::string>& overrides = {}) {
  job_error error;
  std::optional<job_config> config = parse_job(text, "job.toml", overrides, &error);
  EXPECT_TRUE(config.has_value()) << error.message;
  return config;
}

/// The message of a job that must be rejected.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  job_error error;
  std::optional<job_config> config = parse_job(text, "job.toml", overrides, &error);
  EXPECT_FALSE(config.has_value()) << text;
  EXPECT_EQ(error.message.find('\n'), std::string::npos) << error.message;
  return error.message;
}

/// Writes JSON back as TOML: one table per section, arrays and inline tables for the values.
std::string toml_value(const nlohmann::json& value) {
  if (!value.is_object() && !value.is_array()) return value.dump();
  std::string text = value.is_object() ? "{ " : "[";
  const char* separator = "";
  for (auto it = value.begin(); it != value.end(); ++it, separator = ", ") {
    text += separator;
    if (value.is_object()) text += it.key() + " = ";
    text += toml_value(*it);
  }
  return text + (value.is_object() ? " }" : "]");
}

std::string json_to_toml(const nlohmann::json& json) {
  std::string text;
  for (const auto& [section, keys] : json.items()) {
    text += "[" + section + "]\n";
    for (const auto& [key, value] : keys.items()) text += key + " = " + toml_value(value) + "\n";
  }
  return text;
}

TEST(JobFileTest, DefaultsFillEveryKeyNotGiven) {
  std::optional<job_config> config = parse(kMinimal);
  ASSERT_TRUE(config);
  const job_config defaults;
  ASSERT_EQ(config->model.layers.size(), 1u);
  EXPECT_EQ(config->model.layers[0].type, "linear");
  EXPECT_EQ(config->model.layers[0].out, 10);
  EXPECT_TRUE(config->model.layers[0].bias);
  EXPECT_EQ(config->model.input_shape, defaults.model.input_shape);
  EXPECT_EQ(config->data.dataset, "fashion-mnist");
  EXPECT_EQ(config->data.path, defaults.data.path);
  EXPECT_EQ(config->training.batch_size, 64);
  EXPECT_DOUBLE_EQ(config->training.lr, 0.01);
  EXPECT_EQ(config->training.optimizer, "sgd");
  EXPECT_EQ(config->training.seed, 1u);
  EXPECT_EQ(config->parallelism.stages, 1);
  EXPECT_EQ(config->parallelism.devices, std::vector<std::string>{"cpu"});
  EXPECT_EQ(config->parallelism.partition, "balanced");
  EXPECT_EQ(config->parallelism.mode, "sync");
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
  EXPECT_EQ(config->training.precision, "bf16");
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
  EXPECT_EQ(config->training.optimizer, "adam");
  EXPECT_EQ(config->data.path, "/srv/fashion mnist");
  EXPECT_EQ(config->parallelism.mode, "async");
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

TEST(JobFileTest, MalformedOverrideIsNamed) {
  EXPECT_EQ(error_of(kMinimal, {"training.lr"}),
            "job.toml: malformed override 'training.lr': expected section.key=value");
  EXPECT_THAT(error_of(kMinimal, {"lr=0.1"}), HasSubstr("malformed override 'lr=0.1'"));
  EXPECT_THAT(error_of(kMinimal, {"=0.1"}), HasSubstr("malformed override '=0.1'"));
  EXPECT_THAT(error_of(kMinimal, {"training.=1"}), HasSubstr("malformed override"));
  EXPECT_THAT(error_of(kMinimal, {"model.layers.0=1"}), HasSubstr("malformed override"));
  EXPECT_EQ(error_of(kMinimal, {"data.path=\xff"}),
            "job.toml: override of 'data.path' is not valid UTF-8");
}

TEST(JobFileTest, BadOverrideValueSaysItCameFromTheCommandLine) {
  EXPECT_EQ(error_of(kMinimal, {"training.lr=fast"}),
            "job.toml: training.lr must be a number, got a string (from --set)");
  EXPECT_EQ(error_of(kMinimal, {"training.lrr=1"}),
            "job.toml: unknown key 'training.lrr' (from --set); did you mean 'training.lr'?");
  EXPECT_THAT(error_of(kMinimal, {"trainig.lr=1"}), HasSubstr("unknown section 'trainig'"));
}

TEST(JobFileTest, UnknownKeySuggestsTheClosestKey) {
  EXPECT_EQ(error_of(kMinimal + "[training]\nlrr = 0.1\n"),
            "job.toml: unknown key 'training.lrr'; did you mean 'training.lr'?");
  EXPECT_EQ(error_of(kMinimal + "[training]\nbatchsize = 8\n"),
            "job.toml: unknown key 'training.batchsize'; did you mean 'training.batch_size'?");
  EXPECT_EQ(error_of(kMinimal + "[training]\ndevices = \"cpu\"\n"),
            "job.toml: unknown key 'training.devices'; did you mean 'parallelism.devices'?");
  EXPECT_EQ(error_of("lr = 0.1\n" + kMinimal),
            "job.toml: unknown key 'lr'; did you mean 'training.lr'?");
  EXPECT_EQ(error_of(kMinimal + "[training]\ncompletely_different = 1\n"),
            "job.toml: unknown key 'training.completely_different'");
}

TEST(JobFileTest, UnknownSectionIsRejected) {
  EXPECT_EQ(error_of(kMinimal + "[trainig]\nlr = 0.1\n"),
            "job.toml: unknown section 'trainig'; did you mean 'training'?");
  EXPECT_EQ(error_of(kMinimal + "[logging]\n"), "job.toml: unknown section 'logging'");
  EXPECT_EQ(error_of("training = 3\n" + kMinimal),
            "job.toml: training must be a table, got an integer");
}

TEST(JobFileTest, WrongTypeNamesKeyAndBothTypes) {
  EXPECT_EQ(error_of(kMinimal + "[training]\nlr = \"fast\"\n"),
            "job.toml: training.lr must be a number, got a string");
  EXPECT_EQ(error_of(kMinimal + "[training]\nbatch_size = 1.5\n"),
            "job.toml: training.batch_size must be an integer, got a float");
  EXPECT_EQ(error_of(kMinimal + "[metrics]\ntrace = 1\n"),
            "job.toml: metrics.trace must be a boolean, got an integer");
  EXPECT_EQ(error_of(kMinimal + "[data]\npath = [\"a\"]\n"),
            "job.toml: data.path must be a string, got an array");
  EXPECT_THAT(error_of(kMinimal + "[parallelism]\ndevices = 0\n"),
              StartsWith("job.toml: parallelism.devices must be a device name"));
  EXPECT_EQ(error_of("[model]\nlayers = { type = \"relu\" }\n"),
            "job.toml: model.layers must be an array of layer tables, got a table");
}

TEST(JobFileTest, IntegerIsAcceptedWhereANumberIsExpected) {
  std::optional<job_config> config = parse(kMinimal + "[training]\nlr = 1\nweight_decay = 0\n");
  ASSERT_TRUE(config);
  EXPECT_DOUBLE_EQ(config->training.lr, 1.0);
}

TEST(JobFileTest, OutOfRangeValuesNameTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[training]\nbatch_size = 0", "training.batch_size must be >= 1, got 0"},
      {"[training]\nepochs = -1", "training.epochs must be >= 0, got -1"},
      {"[training]\nlr = 0", "training.lr must be > 0, got 0"},
      {"[training]\nlr = -0.1", "training.lr must be > 0, got -0.1"},
      {"[training]\nlr = nan", "training.lr must be a finite number, got nan"},
      {"[training]\nmomentum = 1.0", "training.momentum must be in [0, 1), got 1"},
      {"[training]\nweight_decay = -1", "training.weight_decay must be >= 0, got -1"},
      {"[training]\nseed = -1", "training.seed must be >= 0, got -1"},
      {"[training]\ntarget_accuracy = 1.5", "training.target_accuracy must be in [0, 1], got 1.5"},
      {"[parallelism]\nstages = 0", "parallelism.stages must be >= 1, got 0"},
      {"[parallelism]\nmicro_batches = 0", "parallelism.micro_batches must be >= 1, got 0"},
      {"[parallelism]\nmax_staleness = -2", "parallelism.max_staleness must be >= -1, got -2"},
      {"[parallelism]\nstages = 3000000000", "parallelism.stages must be <= 2147483647"},
      {"[metrics]\nlog_interval = 0", "metrics.log_interval must be >= 1, got 0"},
      {"[training]\noptimizer = \"adma\"",
       "training.optimizer must be one of 'sgd', 'adam', 'adamw', got 'adma'; did you mean "
       "'adam'?"},
      {"[parallelism]\nmode = \"ampnet\"", "parallelism.mode must be one of 'sync', 'async'"},
      {"[parallelism]\nschedule = \"pipedream\"", "parallelism.schedule must be one of"},
      {"[data]\ndataset = \"mnist\"", "data.dataset must be one of 'fashion-mnist', 'synthetic'"},
      {"[training]\nlr_schedule = \"linear\"", "training.lr_schedule must be one of"},
      {"[training]\nprecision = \"fp16\"", "training.precision must be one of"},
      {"[training]\nlr_schedule = \"step\"", "training.lr_decay_epochs must be >= 1 when"},
      {"[parallelism]\ndevices = \"gpu\"",
       "parallelism.devices must be \"cpu\", \"cuda\" or \"cuda:N\", got 'gpu'"},
      {"[parallelism]\ndevices = [\"cpu\", \"cuda:x\"]", "parallelism.devices[1] must be"},
      {"[parallelism]\npartition = \"even\"",
       "parallelism.partition must be \"balanced\", \"measured\", \"uniform\" or an array of cut "
       "points such as [3, 7] or [\"4:784\"] (block 4 from its output 784 on), got 'even'"},
      {"[parallelism]\npartition = [0]", "parallelism.partition[0] must be >= 1, got 0"},
      {"[training]\nbatch_size = 10\n[parallelism]\nmicro_batches = 4",
       "parallelism.micro_batches (4) must divide training.batch_size (10)"},
      {"[parallelism]\nschedule = \"zb-h2\"", "parallelism.schedule must be"},
      {"[parallelism]\nstaleness_correction = \"specgrad\"",
       "parallelism.staleness_correction must be one of 'none', 'pipemare', '2bw', 'predict', "
       "'nesterov'"},
      {"[parallelism]\nstaleness_correction = \"nesterov\"",
       "parallelism.staleness_correction = \"nesterov\" needs training.optimizer = \"sgd\" with "
       "training.momentum > 0, or \"adam\" / \"adamw\": it raises the momentum (β1) of delayed "
       "stages"},
      {"[training]\nnesterov = true",
       "training.nesterov = true needs training.momentum > 0 with training.optimizer = \"sgd\" "
       "(or \"adam\" / \"adamw\": NAdam)"},
      {"[parallelism]\nstaleness_correction = \"predict\"",
       "parallelism.staleness_correction = \"predict\" needs training.optimizer = \"sgd\" with "
       "training.momentum > 0"},
      {"[parallelism]\ncorrection_warmup_steps = -1", "parallelism.correction_warmup_steps"},
      {"[parallelism]\nschedule = \"interleaved\"\nvirtual_stages = 2",
       "parallelism.stages (1) must be a multiple of parallelism.virtual_stages (2)"},
      {"[parallelism]\nmode = \"async\"\nschedule = \"interleaved\"",
       "parallelism.schedule = \"interleaved\" needs mode = \"sync\""},
      {"[parallelism]\nstages = 2", "parallelism.stages (2) exceeds the number of layers"},
      {"[parallelism]\nspin_wait_ms = -0.5",
       "parallelism.spin_wait_ms must be -1 (10 ms in sync mode, 0 in async mode) or >= 0"},
      {"[parallelism]\nspin_wait_ms = inf", "parallelism.spin_wait_ms must be a finite number"},
  };
  for (const auto& [text, expected] : cases) {
    EXPECT_THAT(error_of(kMinimal + text + "\n"), StartsWith("job.toml: " + expected)) << text;
  }
}

TEST(JobFileTest, DevicesAndPartitionMustMatchTheStages) {
  const std::string model =
      "[model]\nlayers = [{type=\"linear\",out=8},{type=\"relu\"},{type=\"linear\",out=2}]\n";
  std::optional<job_config> config =
      parse(model + "[parallelism]\nstages = 3\ndevices = \"cuda\"\npartition = \"1, 2\"\n");
  ASSERT_TRUE(config);
  EXPECT_EQ(config->parallelism.devices, std::vector<std::string>{"cuda"});
  EXPECT_EQ(config->parallelism.partition, "1,2");
  EXPECT_THAT(error_of(model + "[parallelism]\nstages = 3\ndevices = [\"cpu\", \"cuda\"]\n"),
              HasSubstr("parallelism.devices names 2 devices but parallelism.stages is 3"));
  EXPECT_THAT(error_of(model + "[parallelism]\nstages = 2\npartition = [1, 2]\n"),
              HasSubstr("parallelism.partition [1,2] makes 3 stages but parallelism.stages is 2"));
  EXPECT_THAT(error_of(model + "[parallelism]\nstages = 3\npartition = [2, 1]\n"),
              HasSubstr("must be increasing cut points in [1, 2]"));
  EXPECT_THAT(error_of(model + "[parallelism]\nstages = 2\npartition = [3]\n"),
              HasSubstr("must be increasing cut points in [1, 2]"));
}

TEST(JobFileTest, CollectiveMustSuitTheDevices) {
  const std::string model =
      "[model]\nlayers = [{type=\"linear\",out=8},{type=\"relu\"},{type=\"linear\",out=2}]\n"
      "[training]\nbatch_size = 8\n";
  std::optional<job_config> config =
      parse(model +
            "[parallelism]\nstages = 2\nreplicas = 2\ncollective = \"nccl\"\n"
            "devices = [\"cuda:0\", \"cuda:1\", \"cuda:2\", \"cuda:3\"]\n");
  ASSERT_TRUE(config);
  EXPECT_EQ(config->parallelism.collective, "nccl");
  EXPECT_EQ(device_of_actor(*config, 3), "cuda:3");
  EXPECT_EQ(device_of_stage(*config, 1), "cuda:1");
  EXPECT_EQ(parse(model)->parallelism.collective, "ring");
  EXPECT_THAT(error_of(model + "[parallelism]\nreplicas = 2\ncollective = \"nccl\"\n"),
              HasSubstr("parallelism.collective = \"nccl\" needs every stage on a CUDA device, "
                        "but parallelism.devices has \"cpu\""));
  EXPECT_THAT(error_of(model + "[parallelism]\ncollective = \"shared_memory\"\n"
                               "devices = \"cuda\"\n"),
              HasSubstr("parallelism.collective = \"shared_memory\" sums CPU stages"));
  EXPECT_THAT(error_of(model + "[parallelism]\ncollective = \"gloo\"\n"),
              HasSubstr("parallelism.collective"));
  EXPECT_THAT(error_of(model + "[parallelism]\nstages = 2\nreplicas = 2\n"
                               "devices = [\"cpu\", \"cpu\", \"cpu\"]\n"),
              HasSubstr("one per stage of every replica"));
}

TEST(JobFileTest, LayerErrorsNameTheLayer) {
  auto layers = [](const std::string& list) { return "[model]\nlayers = [" + list + "]\n"; };
  EXPECT_EQ(error_of(layers("{type=\"relu\"},{type=\"conv2d\", out=4}")),
            "job.toml: model.layers[1] (conv2d): missing required key 'kernel'");
  EXPECT_EQ(error_of(layers("{type=\"linear\"}")),
            "job.toml: model.layers[0] (linear): missing required key 'out'");
  EXPECT_EQ(error_of(layers("{type=\"linear\", outt=3}")),
            "job.toml: model.layers[0] (linear): unknown key 'outt'; did you mean 'out'?");
  EXPECT_EQ(error_of(layers("{type=\"relu\", out=3}")),
            "job.toml: model.layers[0] (relu): unknown key 'out'");
  EXPECT_EQ(error_of(layers("{type=\"linear\", out=0}")),
            "job.toml: model.layers[0] (linear): out must be >= 1, got 0");
  EXPECT_EQ(error_of(layers("{type=\"linear\", out=4, bias=\"no\"}")),
            "job.toml: model.layers[0] (linear): bias must be a boolean, got a string");
  EXPECT_EQ(error_of(layers("{type=\"dropout\", p=1.0}")),
            "job.toml: model.layers[0] (dropout): p must be in [0, 1), got 1");
  EXPECT_EQ(error_of(layers("{type=\"conv2d\", out=4, kernel=3, padding=-1}")),
            "job.toml: model.layers[0] (conv2d): padding must be >= 0, got -1");
  EXPECT_EQ(error_of(layers("{type=\"lineer\", out=4}")),
            "job.toml: model.layers[0].type must be one of 'linear', 'relu', 'tanh', 'gelu', "
            "'conv2d', 'maxpool2d', 'flatten', 'dropout', 'embedding', 'layernorm', "
            "'transformer_block', 'lm_head', got 'lineer'; did you mean 'linear'?");
  EXPECT_EQ(error_of(layers("{out=4}")), "job.toml: model.layers[0]: missing required key 'type'");
  EXPECT_THAT(error_of(layers("3")), StartsWith("job.toml: model.layers[0] must be a table"));
  EXPECT_EQ(error_of(layers("")), "job.toml: model.layers must not be empty");
  EXPECT_EQ(error_of("[training]\nlr = 0.1\n"), "job.toml: missing required key 'model.layers'");
}

TEST(JobFileTest, InputShapeMustBePositiveIntegers) {
  EXPECT_EQ(error_of(kMinimal + "input_shape = [1, 0, 28]\n"),
            "job.toml: model.input_shape[1] must be >= 1, got 0");
  EXPECT_EQ(error_of(kMinimal + "input_shape = []\n"),
            "job.toml: model.input_shape must not be empty");
  EXPECT_EQ(error_of(kMinimal + "input_shape = 784\n"),
            "job.toml: model.input_shape must be an array of positive integers, got an integer");
}

TEST(JobFileTest, SyntaxErrorGivesFileLineAndColumn) {
  const std::string message = error_of("[model]\nlayers = []\nlr = = 3\n");
  EXPECT_THAT(message, StartsWith("job.toml:3:"));
  EXPECT_THAT(message, HasSubstr("invalid TOML"));
  EXPECT_THAT(error_of(kMinimal + "[training]\nlr = 0.1\nlr = 0.2\n"), StartsWith("job.toml:5:"));
}

TEST(JobFileTest, ErrorPointerMayBeNull) {
  EXPECT_FALSE(parse_job("[[[", "job.toml", {}, nullptr).has_value());
  EXPECT_TRUE(parse_job(kMinimal, "job.toml", {}, nullptr).has_value());
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
