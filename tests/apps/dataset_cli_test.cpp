// `troupe dataset`: a graph model's training and test instances written for other tools, the
// same for the same job, and one clear line for a job whose data are not instances.

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/cli_helpers.h"

namespace troupe::testing {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

/// The value of a ListOps expression ("[MAX 2 9 [MIN 4 7 ] 0 ]"), computed here from its text
/// alone: MAX, MIN, MED (the middle value, or the two middle values' mean rounded down) and SM
/// (the sum modulo 10).
int listops_value(const std::string& expression) {
  std::istringstream words(expression);
  std::vector<std::string> operators;
  std::vector<std::vector<int>> arguments(1);
  for (std::string word; words >> word;) {
    if (word[0] == '[') {
      operators.push_back(word);
      arguments.emplace_back();
      continue;
    }
    if (word != "]") {
      arguments.back().push_back(std::stoi(word));
      continue;
    }
    std::vector<int> values = arguments.back();
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    int value = 0;
    if (operators.back() == "[MAX") value = values.back();
    if (operators.back() == "[MIN") value = values.front();
    if (operators.back() == "[MED")
      value = n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
    if (operators.back() == "[SM")
      for (int v : values) value = (value + v) % 10;
    operators.pop_back();
    arguments.pop_back();
    arguments.back().push_back(value);
  }
  return arguments.front().empty() ? -1 : arguments.front().back();
}

class DatasetCliTest : public troupe_command_test {
 protected:
  fs::path listops_job() {
    return write("listops.toml", R"(
[[model.nodes]]
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
synthetic_train = 60
synthetic_test = 20
[training]
batch_size = 4
)");
  }

  /// Three fortunes in fortune's format, the middle one a single byte (too short to keep).
  fs::path records_job() {
    write("corpus.txt", "First fortune.\n%\n\n%\nThe second kept fortune.\n");
    return write("records.toml", R"(
[[model.nodes]]
name = "embed"
layers = [{ type = "embedding", vocab = 256, dim = 8 }]
next = "cell"
[[model.nodes]]
name = "cell"
layers = [{ type = "lstm_cell", out = 8 }]
route = "loop"
emit = "every"
next = "head"
[[model.nodes]]
name = "head"
layers = [{ type = "linear", out = 256 }]
[data]
dataset = "text-records"
path = ")" + (directory_ / "corpus.txt").string() +
                                     R"("
validation_fraction = 0.5
[training]
batch_size = 2
)");
  }
};

TEST_F(DatasetCliTest, WritesListOpsSplitsWhoseLabelsAreTheirValues) {
  const fs::path out = directory_ / "data";
  const run_result result = troupe("dataset " + listops_job().string() + " --out " + out.string() +
                                   " --set data.synthetic_test=12");
  ASSERT_EQ(result.status, 0) << result.errors;
  EXPECT_NE(result.output.find("60 training and 12 test instances"), std::string::npos)
      << result.output;
  const std::vector<std::string> train = lines_of(read_file(out / "train.tsv"));
  const std::vector<std::string> test = lines_of(read_file(out / "test.tsv"));
  ASSERT_EQ(train.size(), 60u);
  ASSERT_EQ(test.size(), 12u);
  std::set<std::string> expressions;
  for (const std::string& line : train) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    EXPECT_EQ(std::stoi(line.substr(0, tab)), listops_value(line.substr(tab + 1))) << line;
    expressions.insert(line.substr(tab + 1));
  }
  for (const std::string& line : test) {
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    EXPECT_EQ(std::stoi(line.substr(0, tab)), listops_value(line.substr(tab + 1))) << line;
    EXPECT_EQ(expressions.count(line.substr(tab + 1)), 0u) << "in both splits: " << line;
  }
  const auto config = nlohmann::json::parse(read_file(out / "config.json"));
  EXPECT_EQ(config["data"]["dataset"], "listops");
  EXPECT_EQ(config["data"]["synthetic_test"], 12);
  EXPECT_EQ(config["model"]["nodes"][1]["layers"][0]["type"], "tree_lstm_cell");
}

TEST_F(DatasetCliTest, TheSameJobWritesTheSameExpressionsAndAnotherSeedOthers) {
  const fs::path job = listops_job();
  ASSERT_EQ(troupe("dataset " + job.string() + " --out " + (directory_ / "a").string()).status, 0);
  ASSERT_EQ(troupe("dataset " + job.string() + " --out " + (directory_ / "b").string()).status, 0);
  ASSERT_EQ(troupe("dataset " + job.string() + " --out " + (directory_ / "c").string() +
                   " --set data.seed=2")
                .status,
            0);
  const std::string first = read_file(directory_ / "a" / "train.tsv");
  EXPECT_EQ(first, read_file(directory_ / "b" / "train.tsv"));
  EXPECT_NE(first, read_file(directory_ / "c" / "train.tsv"));
}

TEST_F(DatasetCliTest, WritesTextRecordsAsJsonLinesOfTokensAndNextBytes) {
  const fs::path out = directory_ / "records";
  const run_result result = troupe("dataset " + records_job().string() + " --out " + out.string());
  ASSERT_EQ(result.status, 0) << result.errors;
  const std::vector<std::string> train = lines_of(read_file(out / "train.jsonl"));
  const std::vector<std::string> test = lines_of(read_file(out / "test.jsonl"));
  ASSERT_EQ(train.size(), 1u);
  ASSERT_EQ(test.size(), 1u);
  const std::vector<std::string> records = {"First fortune.\n", "The second kept fortune.\n"};
  for (size_t i = 0; i < 2; ++i) {
    const auto line = nlohmann::json::parse(i == 0 ? train[0] : test[0]);
    const auto tokens = line["tokens"].get<std::vector<int>>();
    const auto labels = line["labels"].get<std::vector<int>>();
    ASSERT_EQ(tokens.size(), labels.size());
    std::string text(tokens.begin(), tokens.end());
    text += static_cast<char>(labels.back());
    EXPECT_EQ(text, records[i]);
    for (size_t t = 0; t + 1 < tokens.size(); ++t) EXPECT_EQ(labels[t], tokens[t + 1]) << t;
  }
}

TEST_F(DatasetCliTest, RefusesAJobWhoseDataAreNotInstances) {
  expect_one_line(
      troupe("dataset " + tiny_job().string() + " --out " + (directory_ / "none").string()),
      "data.dataset is \"synthetic\"; troupe dataset writes the instances of a "
      "graph model's data");
  EXPECT_FALSE(fs::exists(directory_ / "none"));
  expect_one_line(troupe("dataset " + (directory_ / "missing.toml").string() + " --out " +
                         (directory_ / "none").string()),
                  "missing.toml");
  expect_one_line(troupe("dataset " + listops_job().string() + " --out " +
                         (directory_ / "none").string() + " --set data.max_depth=0"),
                  "data.max_depth");
}

}  // namespace
}  // namespace troupe::testing
