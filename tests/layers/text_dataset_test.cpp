#include <gtest/gtest.h>

#include <string>

#include "layers/dataset.h"
#include "tests/layers/temp_directory.h"

namespace troupe::layers {
namespace {

TEST(TextDatasetTest, DirectoryFilesAreJoinedInNameOrderWithoutIndexes) {
  temp_directory directory;
  directory.write("b", "efgh");
  directory.write("a", "abcd");
  directory.write("a.dat", std::string("\0\1", 2));
  directory.write("a.u8", "zzzz");
  std::string error;
  const auto splits = load_text_dataset(directory.path(), 3, 0.5, &error);
  ASSERT_TRUE(splits) << error;
  // "abcdefgh": training text "abcd", validation "efgh", one sequence of 3 tokens each.
  EXPECT_EQ(splits->train.features, (std::vector<float>{'a', 'b', 'c'}));
  EXPECT_EQ(splits->train.labels, (std::vector<int32_t>{'b', 'c', 'd'}));
  EXPECT_EQ(splits->validation.features, (std::vector<float>{'e', 'f', 'g'}));
  EXPECT_EQ(splits->validation.labels, (std::vector<int32_t>{'f', 'g', 'h'}));
}

TEST(TextDatasetTest, BinaryOrMissingFilesAreRefusedByName) {
  temp_directory directory;
  std::string error;
  const std::string binary = directory.write("binary", "ab\xff\n");
  EXPECT_FALSE(load_text_dataset(binary, 1, 0.5, &error));
  EXPECT_EQ(error, "data.path: '" + binary + "' is not UTF-8 text (byte 2 is invalid)");
  EXPECT_FALSE(load_text_dataset(directory.file("missing"), 1, 0.5, &error));
  EXPECT_EQ(error, "data.path: '" + directory.file("missing") + "' does not exist");
  EXPECT_FALSE(load_text_dataset(directory.write("short", "ab"), 4, 0.5, &error));
  EXPECT_NE(error.find("too few"), std::string::npos) << error;
}

}  // namespace
}  // namespace troupe::layers
