// The `troupe` binary as a user meets it: bad input gives one clear line and exit status 2;
// a small run writes config.json, metrics.jsonl and summary.json.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

struct run_result {
  int status = -1;
  std::string errors;
  std::string output;
};

std::string read_file(const fs::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() /
                 ("troupe_cli_" +
                  std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(directory_);
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }

  /// Runs `troupe ARGUMENTS` with stdout and stderr captured to files.
  run_result troupe(const std::string& arguments) {
    const fs::path out = directory_ / "stdout.txt", err = directory_ / "stderr.txt";
    const std::string command =
        std::string(TROUPE_BINARY) + " " + arguments + " >" + out.string() + " 2>" + err.string();
    const int raw = std::system(command.c_str());
    run_result result;
    result.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    result.output = read_file(out);
    result.errors = read_file(err);
    return result;
  }

  fs::path write(const std::string& name, const std::string& text) {
    const fs::path path = directory_ / name;
    std::ofstream(path) << text;
    return path;
  }

  /// A tiny synthetic job that trains in well under a second.
  fs::path tiny_job() {
    return write("tiny.toml", R"(
[model]
input_shape = [8]
layers = [{ type = "linear", out = 16 }, { type = "tanh" }, { type = "linear", out = 4 }]
[data]
dataset = "synthetic"
synthetic_train = 512
synthetic_test = 128
classes = 4
[training]
batch_size = 32
epochs = 2
lr = 0.1
target_accuracy = 0.3
[metrics]
log_interval = 4
)");
  }

  static void expect_one_line(const run_result& result, const std::string& needle) {
    EXPECT_EQ(result.status, 2) << result.errors;
    EXPECT_NE(result.errors.find(needle), std::string::npos) << result.errors;
    EXPECT_EQ(std::count(result.errors.begin(), result.errors.end(), '\n'), 1) << result.errors;
  }

  fs::path directory_;
};

TEST_F(CliTest, TrainsAndWritesOutputs) {
  const fs::path out = directory_ / "run";
  run_result result = troupe("train " + tiny_job().string() + " --out " + out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  auto config = nlohmann::json::parse(read_file(out / "config.json"));
  EXPECT_EQ(config["training"]["batch_size"], 32);
  for (const char* section :
       {"model", "data", "parallelism", "training", "checkpoint", "metrics"}) {
    EXPECT_TRUE(config.contains(section)) << section;
  }
  auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
  for (const char* key :
       {"final_test_accuracy", "epochs", "steps", "samples_per_s", "wall_s", "time_to_target_s"}) {
    EXPECT_TRUE(summary.contains(key)) << key;
  }
  EXPECT_EQ(summary["steps"], 32);
  EXPECT_EQ(summary["epochs"], 2);
  EXPECT_GT(summary["final_test_accuracy"].get<double>(), 0.5);
  EXPECT_TRUE(summary["time_to_target_s"].is_number());
  std::istringstream lines(read_file(out / "metrics.jsonl"));
  std::string line;
  int records = 0, evaluations = 0;
  while (std::getline(lines, line)) {
    auto record = nlohmann::json::parse(line);
    for (const char* key : {"step", "epoch", "loss", "samples_per_s", "wall_s"}) {
      EXPECT_TRUE(record.contains(key)) << key << " in " << line;
    }
    ++records;
    evaluations += record.contains("test_accuracy");
  }
  EXPECT_EQ(records, 8 + 2);
  EXPECT_EQ(evaluations, 2);
}

TEST_F(CliTest, SetOverridesTheJobFile) {
  const fs::path out = directory_ / "run";
  run_result result =
      troupe("train " + tiny_job().string() +
             " --set training.epochs=1 --set training.optimizer=adam --out " + out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  auto config = nlohmann::json::parse(read_file(out / "config.json"));
  EXPECT_EQ(config["training"]["optimizer"], "adam");
  EXPECT_EQ(nlohmann::json::parse(read_file(out / "summary.json"))["epochs"], 1);
}

TEST_F(CliTest, MissingJobFile) {
  expect_one_line(troupe("train " + (directory_ / "absent.toml").string()), "absent.toml");
}

TEST_F(CliTest, UnknownKey) {
  expect_one_line(troupe("train " + tiny_job().string() + " --set training.lrr=0.1"),
                  "training.lrr");
}

TEST_F(CliTest, WrongType) {
  expect_one_line(troupe("train " + tiny_job().string() + " --set 'training.batch_size=\"big\"'"),
                  "training.batch_size");
}

TEST_F(CliTest, ShapesThatDoNotChain) {
  expect_one_line(troupe("train " + tiny_job().string() +
                         " --set 'model.layers=[{type=\"conv2d\",out=2,kernel=3}]'"),
                  "model.layers[0] (conv2d)");
}

TEST_F(CliTest, LastLayerMustMatchClasses) {
  expect_one_line(
      troupe("train " + tiny_job().string() + " --set 'model.layers=[{type=\"linear\",out=3}]'"),
      "per class");
}

TEST_F(CliTest, ModelTooLargeForMemory) {
  expect_one_line(troupe("train " + tiny_job().string() +
                         " --set 'model.layers=[{type=\"linear\",out=2000000000},"
                         "{type=\"linear\",out=4}]'"),
                  "more than this machine's memory");
}

TEST_F(CliTest, BatchLargerThanTrainingSet) {
  expect_one_line(troupe("train " + tiny_job().string() + " --set training.batch_size=1024"),
                  "training.batch_size");
}

TEST_F(CliTest, MissingDataFiles) {
  expect_one_line(
      troupe("train " + tiny_job().string() + " --set data.dataset=fashion-mnist --set data.path=" +
             (directory_ / "nowhere").string() + " --set 'model.input_shape=[1,28,28]'" +
             " --set 'model.layers=[{type=\"flatten\"},{type=\"linear\",out=10}]'"),
      "nowhere");
}

TEST_F(CliTest, CorruptIdxHeader) {
  const fs::path data = directory_ / "data";
  fs::create_directories(data);
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"}) {
    gzFile file = gzopen((data / name).c_str(), "wb");
    const char garbage[] = "this is not an IDX file at all";
    gzwrite(file, garbage, sizeof garbage);
    gzclose(file);
  }
  expect_one_line(troupe("train " + tiny_job().string() +
                         " --set data.dataset=fashion-mnist --set data.path=" + data.string() +
                         " --set 'model.input_shape=[1,28,28]'" +
                         " --set 'model.layers=[{type=\"flatten\"},{type=\"linear\",out=10}]'"),
                  "train-images-idx3-ubyte.gz");
}

TEST_F(CliTest, UnknownOptionAndUnknownDevice) {
  EXPECT_EQ(troupe("train " + tiny_job().string() + " --bogus").status, 2);
  EXPECT_EQ(troupe("frobnicate").status, 2);
  expect_one_line(troupe("train " + tiny_job().string() + " --set parallelism.devices=tpu"),
                  "parallelism.devices");
}

TEST_F(CliTest, PipelinedRunWritesStagesAndTrace) {
  const fs::path out = directory_ / "run";
  run_result result = troupe("train " + tiny_job().string() +
                             " --set parallelism.stages=3 --set parallelism.mode=async"
                             " --set parallelism.max_active_keys=3 --set metrics.trace=true"
                             " --out " +
                             out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
  ASSERT_EQ(summary["stages"].size(), 3u);
  for (const auto& stage : summary["stages"]) {
    // Three keys in flight, one step per key: a backward sees at most 2 newer versions.
    EXPECT_LE(stage["staleness_histogram"].size(), 3u);
    EXPECT_EQ(stage["optimizer_steps"], 32);
  }
  auto trace = nlohmann::json::parse(read_file(out / "trace.json"));
  int forwards = 0;
  for (const auto& event : trace["traceEvents"]) forwards += event["name"] == "forward";
  EXPECT_EQ(forwards, 2 * 32);  // stages 0 and 1, one key per step, 32 steps in 2 epochs
}

TEST_F(CliTest, BadPipelineSettings) {
  expect_one_line(troupe("train " + tiny_job().string() + " --set parallelism.stages=9"),
                  "parallelism.stages");
  expect_one_line(troupe("train " + tiny_job().string() + " --set parallelism.max_active_keys=0"),
                  "parallelism.max_active_keys");
  expect_one_line(troupe("train " + tiny_job().string() + " --set parallelism.schedule=zigzag"),
                  "parallelism.schedule");
  expect_one_line(troupe("train " + tiny_job().string() + " --set parallelism.devices=cuda:7"),
                  "parallelism.devices");
}

TEST_F(CliTest, BenchWritesJson) {
  const fs::path json = directory_ / "bench.json";
  run_result result = troupe("bench compute --threads 1 --seconds 0.05 --json " + json.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  auto figures = nlohmann::json::parse(read_file(json));
  EXPECT_GT(figures["sgemm_2048_gflops"].get<double>(), 0.0);
  ASSERT_EQ(figures["training"].size(), 2u);
  EXPECT_GT(figures["training"][0]["fraction_of_peak"].get<double>(), 0.0);
  EXPECT_EQ(figures["layers"].size(), 8u);
}

}  // namespace
