// A job file's mistakes are rejected with one line that names the key, the layer or the place
// in the file, and says what was expected.

#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "actors/config/job_file.h"
#include "actors/engine/stage_settings.h"
#include "tests/actors/config/job_file_test_support.h"

namespace troupe::actors {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace job_file_testing;

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
  EXPECT_EQ(config->parallelism.collective, collective_kind::nccl);
  EXPECT_EQ(device_of_actor(*config, 3), "cuda:3");
  EXPECT_EQ(device_of_stage(*config, 1), "cuda:1");
  EXPECT_EQ(parse(model)->parallelism.collective, collective_kind::ring);
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
            "'transformer_block', 'lm_head', 'lstm_cell', 'tree_lstm_cell', got 'lineer'; did "
            "you mean 'linear'?");
  EXPECT_EQ(error_of(layers("{type=\"tree_lstm_cell\", out=4, arity=0}")),
            "job.toml: model.layers[0] (tree_lstm_cell): arity must be >= 1, got 0");
  EXPECT_EQ(error_of(layers("{out=4}")), "job.toml: model.layers[0]: missing required key 'type'");
  EXPECT_THAT(error_of(layers("3")), StartsWith("job.toml: model.layers[0] must be a table"));
  EXPECT_EQ(error_of(layers("")), "job.toml: model.layers must not be empty");
  EXPECT_EQ(error_of("[training]\nlr = 0.1\n"),
            "job.toml: missing required key 'model.layers' (or [[model.nodes]], a graph)");
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

}  // namespace
}  // namespace troupe::actors
