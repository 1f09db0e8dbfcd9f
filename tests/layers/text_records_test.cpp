#include "layers/text_records.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/layers/temp_directory.h"

namespace troupe::layers {
namespace {

const char* const fortunes_directory = "/usr/share/games/fortunes";

std::vector<int32_t> bytes_of(const std::string& text) {
  return std::vector<int32_t>(text.begin(), text.end());
}

/// Each instance as "tokens|labels".
std::vector<std::string> pieces(const instance_dataset& data) {
  std::vector<std::string> result;
  for (const instance& item : data.instances) {
    EXPECT_EQ(instance_error(data, item), "");
    EXPECT_TRUE(item.is_sequence());
    result.push_back(std::string(item.tokens.begin(), item.tokens.end()) + "|" +
                     std::string(item.labels.begin(), item.labels.end()));
  }
  return result;
}

TEST(TextRecordsTest, RecordsAreCutAtPercentLinesAndIntoPiecesOfContext) {
  temp_directory directory;
  // Records "ab\ncd\n", "x\n", an empty one (dropped), "0123456789\n" and "y" (one byte, dropped).
  directory.write("a", "ab\ncd\n%\nx\n%\n%\n0123456789\n%\r\ny");
  std::string error;
  const auto splits = load_text_records(directory.path(), 4, 0.34, &error);
  ASSERT_TRUE(splits) << error;
  EXPECT_EQ(pieces(splits->train), (std::vector<std::string>{"ab\nc|b\ncd", "d|\n", "x|\n"}));
  EXPECT_EQ(pieces(splits->validation),
            (std::vector<std::string>{"0123|1234", "4567|5678", "89|9\n"}));
  EXPECT_EQ(splits->train.vocabulary, 256);
  EXPECT_EQ(splits->train.classes, 256);
  EXPECT_EQ(splits->train.arity, 1);
  EXPECT_EQ(splits->train.total_parts(), 6);
}

TEST(TextRecordsTest, RecordOfContextPlusOneBytesIsOnePiece) {
  temp_directory directory;
  directory.write("a", "abcde%\n%\nfg");
  std::string error;
  const auto splits = load_text_records(directory.file("a"), 6, 0.5, &error);
  ASSERT_TRUE(splits) << error;
  EXPECT_EQ(pieces(splits->train), std::vector<std::string>{"abcde%|bcde%\n"});
  EXPECT_EQ(pieces(splits->validation), std::vector<std::string>{"f|g"});
}

TEST(TextRecordsTest, FilesInNameOrderEachWithoutSeparatorsOneRecord) {
  temp_directory directory;
  directory.write("b", "second\n\nparagraph\n");
  directory.write("a", "first\n");
  directory.write("a.dat", std::string("\0\1\2", 3));
  directory.write("a.u8", "skipped\n");
  std::string error;
  const auto splits = load_text_records(directory.path(), 100, 0.5, &error);
  ASSERT_TRUE(splits) << error;
  ASSERT_EQ(splits->train.count(), 1);
  ASSERT_EQ(splits->validation.count(), 1);
  EXPECT_EQ(splits->train.instances[0].tokens, bytes_of("first"));
  EXPECT_EQ(splits->validation.instances[0].tokens, bytes_of("second\n\nparagraph"));
  EXPECT_EQ(splits->validation.instances[0].labels, bytes_of("econd\n\nparagraph\n"));
}

TEST(TextRecordsTest, BinaryMissingAndTooSmallInputsAreRefusedByName) {
  temp_directory directory;
  std::string error;
  const std::string binary = directory.write("binary", std::string("ab\0cd\n", 6));
  EXPECT_FALSE(load_text_records(directory.path(), 8, 0.5, &error));
  EXPECT_NE(error.find("'" + binary + "' is not UTF-8 text (byte 2 is NUL)"), std::string::npos)
      << error;
  EXPECT_FALSE(load_text_records(directory.file("missing"), 8, 0.5, &error));
  EXPECT_NE(error.find("does not exist"), std::string::npos) << error;
  const std::string one = directory.write("one", "only one record\n");
  EXPECT_FALSE(load_text_records(one, 8, 0.5, &error));
  EXPECT_NE(error.find("holds 1 records"), std::string::npos) << error;
  EXPECT_FALSE(load_text_records(one, 0, 0.5, &error));
  EXPECT_NE(error.find("data.context"), std::string::npos) << error;
}

TEST(TextRecordsTest, FortunesLoadOneInstancePerFortune) {
  struct stat info;
  if (stat(fortunes_directory, &info) != 0) GTEST_SKIP() << fortunes_directory << " is missing";
  std::string error;
  const auto whole = load_text_records(fortunes_directory, int64_t{1} << 40, 0.05, &error);
  ASSERT_TRUE(whole) << error;
  std::vector<int64_t> lengths;
  for (const instance_dataset* split : {&whole->train, &whole->validation})
    for (const instance& item : split->instances) lengths.push_back(item.parts() + 1);
  std::sort(lengths.begin(), lengths.end());
  const auto records = static_cast<int64_t>(lengths.size());
  std::printf(
      "fortunes: %lld records (%lld train, %lld validation), bytes per record: min %lld, "
      "median %lld, max %lld, total %lld tokens\n",
      static_cast<long long>(records), static_cast<long long>(whole->train.count()),
      static_cast<long long>(whole->validation.count()), static_cast<long long>(lengths.front()),
      static_cast<long long>(lengths[lengths.size() / 2]), static_cast<long long>(lengths.back()),
      static_cast<long long>(whole->train.total_parts() + whole->validation.total_parts()));
  EXPECT_GT(records, 1000);
  EXPECT_NEAR(static_cast<double>(whole->validation.count()), records * 0.05, 1.0);
  EXPECT_LT(lengths.front(), lengths.back());

  const auto cut = load_text_records(fortunes_directory, 256, 0.05, &error);
  ASSERT_TRUE(cut) << error;
  std::printf("fortunes at a context of 256: %lld train and %lld validation instances\n",
              static_cast<long long>(cut->train.count()),
              static_cast<long long>(cut->validation.count()));
  EXPECT_GE(cut->train.count(), whole->train.count());
  EXPECT_EQ(cut->train.total_parts(), whole->train.total_parts());
  for (const instance& item : cut->train.instances) ASSERT_LE(item.parts(), 256);
}

}  // namespace
}  // namespace troupe::layers
