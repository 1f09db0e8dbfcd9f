#include "layers/listops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/layers/temp_directory.h"

namespace troupe::layers {
namespace {

/// What the test measures of an expression's text, with its value from a stack evaluator that
/// shares no code with the generator.
struct evaluated {
  int value = -1;
  int depth = 0;
  int most_arguments = 0;
  int fewest_arguments = 1 << 30;
  int tokens = 0;
};

int reduce(const std::string& op, std::vector<int> values) {
  if (op == "[MAX") return *std::max_element(values.begin(), values.end());
  if (op == "[MIN") return *std::min_element(values.begin(), values.end());
  if (op == "[SM") {
    int sum = 0;
    for (int value : values) sum = (sum + value) % 10;
    return sum;
  }
  EXPECT_EQ(op, "[MED");
  std::sort(values.begin(), values.end());
  const size_t half = values.size() / 2;
  const double median =
      values.size() % 2 == 1 ? values[half] : (values[half - 1] + values[half]) / 2.0;
  return static_cast<int>(std::floor(median));  // int(np.median(values)), as the original
}

evaluated evaluate(const std::string& text) {
  evaluated result;
  std::vector<std::pair<std::string, std::vector<int>>> open;
  std::istringstream words(text);
  for (std::string word; words >> word; ++result.tokens) {
    if (word[0] == '[') {
      open.push_back({word, {}});
      result.depth = std::max(result.depth, static_cast<int>(open.size()));
      continue;
    }
    int value = 0;
    if (word == "]") {
      const int count = static_cast<int>(open.back().second.size());
      result.most_arguments = std::max(result.most_arguments, count);
      result.fewest_arguments = std::min(result.fewest_arguments, count);
      value = reduce(open.back().first, open.back().second);
      open.pop_back();
    } else {
      value = std::stoi(word);
    }
    if (open.empty())
      result.value = value;
    else
      open.back().second.push_back(value);
  }
  return result;
}

listops_options small_options(int64_t train, int64_t test) {
  listops_options options;
  options.train_count = train;
  options.test_count = test;
  return options;
}

std::vector<std::string> texts(const instance_dataset& data) {
  std::vector<std::string> result;
  for (const instance& item : data.instances) result.push_back(listops_text(item));
  return result;
}

TEST(ListOpsTest, ExpressionIsALeftBranchingBinaryTreeInPostOrder) {
  std::string error;
  const auto flat = parse_listops("[MAX 2 9 ]", &error);
  ASSERT_TRUE(flat) << error;
  // [MAX, 2, ([MAX 2), 9, (([MAX 2) 9), ], the root.
  EXPECT_EQ(flat->tokens, (std::vector<int32_t>{10, 2, 15, 9, 15, 14, 15}));
  EXPECT_EQ(flat->parent, (std::vector<int32_t>{2, 2, 4, 4, 6, 6, -1}));
  EXPECT_EQ(flat->labels, std::vector<int32_t>{9});

  const auto nested = parse_listops("[MIN 3 [SM 4 8 ] ]", &error);
  ASSERT_TRUE(nested) << error;
  EXPECT_EQ(nested->tokens,
            (std::vector<int32_t>{11, 3, 15, 13, 4, 15, 8, 15, 14, 15, 15, 14, 15}));
  EXPECT_EQ(nested->parent, (std::vector<int32_t>{2, 2, 10, 5, 5, 7, 7, 9, 9, 10, 12, 12, -1}));
  EXPECT_EQ(nested->labels, std::vector<int32_t>{2});
  EXPECT_EQ(listops_text(*nested), "[MIN 3 [SM 4 8 ] ]");
}

TEST(ListOpsTest, MedianOfAnEvenCountIsTheMiddlePairsMeanRoundedDown) {
  std::string error;
  EXPECT_EQ(parse_listops("[MED 1 2 ]", &error)->labels[0], 1);
  EXPECT_EQ(parse_listops("[MED 9 3 6 4 ]", &error)->labels[0], 5);
  EXPECT_EQ(parse_listops("[MED 7 1 4 ]", &error)->labels[0], 4);
  EXPECT_EQ(parse_listops("[SM 9 8 7 ]", &error)->labels[0], 4);
}

TEST(ListOpsTest, ValuesMatchAnIndependentEvaluator) {
  std::string error;
  const auto data = generate_listops(small_options(2000, 500), &error);
  ASSERT_TRUE(data) << error;
  ASSERT_EQ(data->train.count(), 2000);
  ASSERT_EQ(data->validation.count(), 500);
  int64_t tokens = 0;
  for (const instance_dataset* split : {&data->train, &data->validation}) {
    EXPECT_EQ(split->vocabulary, 16);
    EXPECT_EQ(split->classes, 10);
    EXPECT_EQ(split->arity, 2);
    for (const instance& item : split->instances) {
      const std::string text = listops_text(item);
      const evaluated expected = evaluate(text);
      ASSERT_EQ(item.labels, std::vector<int32_t>{expected.value}) << text;
      ASSERT_EQ(instance_error(*split, item), "") << text;
      ASSERT_EQ(item.parts(), 2 * expected.tokens - 1) << text;
      tokens += expected.tokens;
    }
  }
  std::printf("ListOps with the defaults: %.1f tokens per expression\n", tokens / 2500.0);
}

TEST(ListOpsTest, BoundsHoldAndAreReached) {
  listops_options options = small_options(1500, 0);
  options.max_depth = 3;
  options.max_arguments = 4;
  options.max_tokens = 30;
  options.list_probability = 0.4;
  std::string error;
  const auto data = generate_listops(options, &error);
  ASSERT_TRUE(data) << error;
  evaluated most;
  for (const std::string& text : texts(data->train)) {
    const evaluated seen = evaluate(text);
    EXPECT_LE(seen.depth, 3) << text;
    EXPECT_LE(seen.most_arguments, 4) << text;
    EXPECT_GE(seen.fewest_arguments, 2) << text;
    EXPECT_LE(seen.tokens, 30) << text;
    most.depth = std::max(most.depth, seen.depth);
    most.most_arguments = std::max(most.most_arguments, seen.most_arguments);
    most.tokens = std::max(most.tokens, seen.tokens);
  }
  EXPECT_EQ(most.depth, 3);
  EXPECT_EQ(most.most_arguments, 4);
  EXPECT_GE(most.tokens, 28);
}

TEST(ListOpsTest, SameSeedSameSetsAndTestDisjointFromTrain) {
  std::string error;
  const auto first = generate_listops(small_options(1000, 300), &error);
  const auto again = generate_listops(small_options(1000, 300), &error);
  listops_options other = small_options(1000, 300);
  other.seed = 2;
  const auto different = generate_listops(other, &error);
  ASSERT_TRUE(first && again && different) << error;
  EXPECT_EQ(texts(first->train), texts(again->train));
  EXPECT_EQ(texts(first->validation), texts(again->validation));
  EXPECT_NE(texts(first->train), texts(different->train));
  const auto train = texts(first->train);
  const auto test = texts(first->validation);
  std::set<std::string> all(train.begin(), train.end());
  all.insert(test.begin(), test.end());
  EXPECT_EQ(all.size(), train.size() + test.size());
}

TEST(ListOpsTest, EveryClassAppearsIn2000Samples) {
  std::string error;
  const auto data = generate_listops(small_options(2000, 0), &error);
  ASSERT_TRUE(data) << error;
  std::vector<int> counts(10, 0);
  for (const instance& item : data->train.instances) ++counts[item.labels[0]];
  for (int label = 0; label < 10; ++label) EXPECT_GT(counts[label], 0) << "class " << label;
}

TEST(ListOpsTest, SavedSetLoadsBackIdentical) {
  temp_directory directory;
  std::string error;
  const auto data = generate_listops(small_options(200, 0), &error);
  ASSERT_TRUE(data) << error;
  ASSERT_TRUE(save_listops(directory.file("listops.tsv"), data->train, &error)) << error;
  const auto loaded = load_listops(directory.file("listops.tsv"), &error);
  ASSERT_TRUE(loaded) << error;
  ASSERT_EQ(loaded->count(), 200);
  for (int64_t i = 0; i < 200; ++i) {
    const instance& saved = data->train.instances[i];
    const instance& read = loaded->instances[i];
    EXPECT_EQ(read.tokens, saved.tokens);
    EXPECT_EQ(read.parent, saved.parent);
    EXPECT_EQ(read.labels, saved.labels);
  }
  std::ifstream file(directory.file("listops.tsv"));
  std::string line;
  std::getline(file, line);
  EXPECT_EQ(line, std::to_string(data->train.instances[0].labels[0]) + "\t" +
                      listops_text(data->train.instances[0]));
}

TEST(ListOpsTest, BracketedFormOfTheOriginalDataParses) {
  std::string error;
  const auto bracketed = parse_listops("( ( ( ( [MAX 2 ) 9 ) [MIN 4 7 ] ) ] )", &error);
  const auto plain = parse_listops("[MAX 2 9 [MIN 4 7 ] ]", &error);
  ASSERT_TRUE(bracketed && plain) << error;
  EXPECT_EQ(bracketed->tokens, plain->tokens);
  EXPECT_EQ(bracketed->parent, plain->parent);
}

TEST(ListOpsTest, BadTextIsRefusedWithAReason) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {"3", "does not start with a list"},
      {"[MAX 1 2", "no closing"},
      {"[MAX ]", "no arguments"},
      {"[MAX 1 ] 2", "follow"},
      {"[MAX 1 12 ]", "unknown token '12'"}};
  for (const auto& [text, reason] : cases) {
    std::string error;
    EXPECT_FALSE(parse_listops(text, &error)) << text;
    EXPECT_NE(error.find(reason), std::string::npos) << text << ": " << error;
  }
  temp_directory directory;
  std::string error;
  const std::string path = directory.write("bad.tsv", "9\t[MAX 1 9 ]\n\n3\t[MAX 3 4 ]\n");
  EXPECT_FALSE(load_listops(path, &error));
  EXPECT_NE(error.find(path + ":3: the label '3' is not the expression's value 4"),
            std::string::npos)
      << error;
  EXPECT_FALSE(load_listops(directory.write("tabless.tsv", "9 [MAX 1 9 ]\n"), &error));
  EXPECT_NE(error.find(":1: no tab"), std::string::npos) << error;
  EXPECT_FALSE(load_listops(directory.file("missing.tsv"), &error));
  EXPECT_EQ(error, directory.file("missing.tsv") + ": missing");
}

TEST(ListOpsTest, BadOptionsAndTooFewDistinctExpressionsAreRefused) {
  std::string error;
  listops_options options = small_options(10, 10);
  options.max_depth = 0;
  EXPECT_FALSE(generate_listops(options, &error));
  EXPECT_NE(error.find("data.max_depth"), std::string::npos) << error;
  options = small_options(10, 10);
  options.max_arguments = 1;
  EXPECT_FALSE(generate_listops(options, &error));
  EXPECT_NE(error.find("data.max_arguments"), std::string::npos) << error;
  options = small_options(10, 10);
  options.max_tokens = 3;
  EXPECT_FALSE(generate_listops(options, &error));
  EXPECT_NE(error.find("data.context"), std::string::npos) << error;
  // Flat lists of two digits: 4 operators × 100 pairs = 400 distinct expressions.
  options = small_options(300, 100);
  options.max_depth = 1;
  options.max_arguments = 2;
  ASSERT_TRUE(generate_listops(options, &error)) << error;
  options.test_count = 101;
  EXPECT_FALSE(generate_listops(options, &error));
  EXPECT_NE(error.find("401 distinct ListOps expressions"), std::string::npos) << error;
}

}  // namespace
}  // namespace troupe::layers
