// The command line on language models: byte-level text jobs train, report bits per byte and
// generate; bad text jobs get one line naming the problem and exit status 2.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/support/cli_helpers.h"

namespace troupe::testing {
namespace {

class text_command_test : public troupe_command_test {
 protected:
  /// A few kilobytes of text in DIR/corpus/.
  fs::path corpus() {
    const fs::path directory = directory_ / "corpus";
    fs::create_directories(directory);
    std::string text;
    for (int i = 0; i < 200; ++i)
      text += "A fortune a day keeps the doctor away. Or not " + std::to_string(i) + ".\n";
    std::ofstream(directory / "fortunes") << text;
    std::ofstream(directory / "fortunes.dat") << std::string("\0\0\x02\xff", 4);  // skipped
    return directory;
  }

  /// A 2-block GPT job on `data_path` with `layers` replaced when given.
  fs::path gpt_job(const fs::path& data_path, const std::string& extra = "",
                   const std::string& embedding = "{ type = \"embedding\", vocab = 256, dim = 16 }",
                   const std::string& heads = "2") {
    return write("gpt.toml",
                 "[model]\nlayers = [" + embedding +
                     ",\n  { type = \"transformer_block\", heads = " + heads +
                     " },\n  { type = \"layernorm\" }, { type = \"lm_head\", vocab = 256 }]\n"
                     "[data]\ndataset = \"text\"\npath = \"" +
                     data_path.string() +
                     "\"\ncontext = 16\n[parallelism]\nstages = 2\nmode = \"sync\"\n"
                     "micro_batches = 2\n[training]\nbatch_size = 8\nmax_steps = 20\n"
                     "optimizer = \"adamw\"\nlr = 3e-3\nclip_norm = 1.0\n"
                     "[checkpoint]\ninterval_steps = 20\n" +
                     extra);
  }
};

TEST_F(text_command_test, TrainsReportsBitsPerByteAndGenerates) {
  const fs::path out = directory_ / "run";
  const run_result trained =
      troupe("train " + gpt_job(corpus()).string() + " --out " + out.string());
  ASSERT_EQ(trained.status, 0) << trained.errors;
  EXPECT_NE(trained.output.find("bits_per_byte"), std::string::npos) << trained.output;
  const auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
  EXPECT_GT(summary.value("tokens_per_s", 0.0), 0.0);
  const double bits = summary.value("bits_per_byte", 0.0);
  // 20 steps leave the model far from the text but well below uniform guessing (8 bits).
  EXPECT_GT(bits, 0.5);
  EXPECT_LT(bits, 7.0);
  EXPECT_NEAR(bits, summary.value("validation_loss", 0.0) / std::log(2.0), 1e-9);

  const run_result sample =
      troupe("generate " + out.string() + " --prompt 'A fortune' --tokens 40 --seed 7");
  ASSERT_EQ(sample.status, 0) << sample.errors;
  EXPECT_EQ(sample.output.rfind("A fortune", 0), 0u) << sample.output;
  EXPECT_EQ(sample.output.size(), std::string("A fortune").size() + 40 + 1) << sample.output;
  EXPECT_EQ(
      troupe("generate " + out.string() + " --prompt 'A fortune' --tokens 40 --seed 7").output,
      sample.output)
      << "a seed names one sample";

  // The same weights exported to safetensors generate the same text.
  const fs::path file = directory_ / "gpt.safetensors";
  ASSERT_EQ(troupe("export " + (out / "checkpoints").string() + " " + file.string()).status, 0);
  const run_result again =
      troupe("generate " + file.string() + " --job " + (directory_ / "gpt.toml").string() +
             " --prompt 'A fortune' --tokens 40 --seed 7");
  EXPECT_EQ(again.output, sample.output) << again.errors;
}

TEST_F(text_command_test, TestSamplesCountsSequencesAndAnEmptyTestSplitIsAnError) {
  // data.test_samples = 3 keeps 3 sequences of 16 bytes, not 3 labels (which held no sequence,
  // and the run waited for an evaluation that never came).
  const fs::path out = directory_ / "few";
  const run_result trained =
      troupe("train " + gpt_job(corpus()).string() +
             " --set data.test_samples=3 --set training.max_steps=2 --out " + out.string());
  ASSERT_EQ(trained.status, 0) << trained.errors;
  const auto summary = nlohmann::json::parse(read_file(out / "summary.json"));
  EXPECT_TRUE(summary.value("evaluated", false)) << summary.dump();
  // So little held out that no sequence fits: one line naming the key, before any training.
  expect_one_line(
      troupe("train " + gpt_job(corpus()).string() + " --set data.validation_fraction=0.0001"),
      "too few for one training and one validation sequence");
}

TEST_F(text_command_test, GlobalClippingAcrossWorkerProcessesMatchesOneProcess) {
  // Sync mode with clip_norm: the optimizer_step messages travel between worker processes.
  const fs::path job = gpt_job(corpus(), "[metrics]\nprogress = false\n");
  const run_result one =
      troupe("train " + job.string() + " --out " + (directory_ / "one").string());
  const run_result two =
      troupe("train " + job.string() + " --workers 2 --out " + (directory_ / "two").string());
  ASSERT_EQ(one.status, 0) << one.errors;
  ASSERT_EQ(two.status, 0) << two.errors;
  const auto first = nlohmann::json::parse(read_file(directory_ / "one" / "summary.json"));
  const auto second = nlohmann::json::parse(read_file(directory_ / "two" / "summary.json"));
  EXPECT_EQ(first["validation_loss"], second["validation_loss"]);
  EXPECT_EQ(first["steps"], 20);
}

TEST_F(text_command_test, ContextLongerThanPositions) {
  expect_one_line(
      troupe("train " +
             gpt_job(corpus(), "", "{ type = \"embedding\", vocab = 256, dim = 16, positions = 8 }")
                 .string()),
      "the context is 16 tokens but positions is 8");
}

TEST_F(text_command_test, HeadsThatDoNotDivideTheWidth) {
  expect_one_line(troupe("train " + gpt_job(corpus(), "",
                                            "{ type = \"embedding\", vocab = "
                                            "256, dim = 16 }",
                                            "3")
                                        .string()),
                  "heads (3) must divide the width 16");
}

TEST_F(text_command_test, VocabularySmallerThanTheDataLargestToken) {
  const fs::path directory = directory_ / "utf8";
  fs::create_directories(directory);
  std::string text;
  for (int i = 0; i < 100; ++i) text += "Größe und Gewicht, naïve café. ";
  std::ofstream(directory / "text") << text;
  expect_one_line(
      troupe("train " +
             gpt_job(directory, "", "{ type = \"embedding\", vocab = 128, dim = 16 }").string()),
      "vocab = 128 is smaller than the data's largest token");
}

TEST_F(text_command_test, DirectoryWithoutText) {
  const fs::path empty = directory_ / "nothing";
  fs::create_directories(empty);
  std::ofstream(empty / "index.dat") << "x";
  expect_one_line(troupe("train " + gpt_job(empty).string()), "has no readable text files");
}

TEST_F(text_command_test, BinaryAndMissingFiles) {
  const fs::path binary = directory_ / "binary.txt";
  std::ofstream(binary) << std::string("text\0more", 9);
  expect_one_line(troupe("train " + gpt_job(binary).string()), "is not UTF-8 text (byte 4 is NUL)");
  expect_one_line(troupe("train " + gpt_job(directory_ / "missing").string()), "does not exist");
}

TEST_F(text_command_test, GenerateRefusesAClassifier) {
  const fs::path job = write("mlp.toml", mlp_model("relu", "tanh") + synthetic_data(64, 16) +
                                             "[training]\nbatch_size = 16\nmax_steps = 2\n");
  const fs::path out = directory_ / "mlp";
  ASSERT_EQ(troupe("train " + job.string() + " --out " + out.string() +
                   " --set checkpoint.interval_steps=2")
                .status,
            0);
  expect_one_line(troupe("generate " + out.string() + " --prompt hi"), "is not a language model");
}

}  // namespace
}  // namespace troupe::testing
