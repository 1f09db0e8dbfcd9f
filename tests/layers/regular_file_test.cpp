// Readers refuse a FIFO (or any special file) where they expect a regular file, naming it,
// instead of blocking for ever on a pipe that has no writer.

#include "layers/regular_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "layers/dataset.h"
#include "layers/listops.h"
#include "tests/layers/temp_directory.h"

namespace troupe::layers {
namespace {

std::string make_fifo(const temp_directory& directory, const std::string& name) {
  const std::string path = directory.file(name);
  EXPECT_EQ(::mkfifo(path.c_str(), 0600), 0);
  return path;
}

TEST(RegularFileTest, NamesWhatAPathIsWhenItIsNotARegularFile) {
  temp_directory directory;
  const std::string fifo = make_fifo(directory, "pipe");
  EXPECT_EQ(regular_file_problem(directory.write("plain", "x")), "");
  EXPECT_EQ(regular_file_problem(fifo), fifo + ": a FIFO, not a regular file");
  EXPECT_EQ(regular_file_problem(directory.path()),
            directory.path() + ": a directory, not a regular file");
  EXPECT_EQ(regular_file_problem(directory.file("absent")), directory.file("absent") + ": missing");
  EXPECT_EQ(regular_file_problem("/dev/null"), "/dev/null: a character device, not a regular file");
}

TEST(RegularFileTest, OpeningAFifoReturnsAtOnceWithTheReason) {
  temp_directory directory;
  const std::string fifo = make_fifo(directory, "pipe");
  std::string error;
  EXPECT_EQ(open_regular_file(fifo, &error), -1);  // a blocking open would never return
  EXPECT_EQ(error, fifo + ": a FIFO, not a regular file");
  const int file = open_regular_file(directory.write("plain", "abc"), &error);
  ASSERT_GE(file, 0) << error;
  char bytes[4] = {};
  EXPECT_EQ(::read(file, bytes, sizeof bytes), 3);
  ::close(file);
}

TEST(RegularFileTest, DataSetReadersRefuseAFifo) {
  temp_directory directory;
  make_fifo(directory, "train-images-idx3-ubyte");
  make_fifo(directory, "train-labels-idx1-ubyte");
  std::string error;
  EXPECT_FALSE(load_idx_dataset(directory.path(), "train", &error));
  EXPECT_NE(error.find("-ubyte: a FIFO, not a regular file"), std::string::npos) << error;
  const std::string text = make_fifo(directory, "fortunes");
  error.clear();
  EXPECT_FALSE(load_text_dataset(text, 16, 0.1, &error));
  EXPECT_NE(error.find(text + ": a FIFO, not a regular file"), std::string::npos) << error;
  const std::string listops = make_fifo(directory, "listops.tsv");
  error.clear();
  EXPECT_FALSE(load_listops(listops, &error));
  EXPECT_EQ(error, listops + ": a FIFO, not a regular file");
}

}  // namespace
}  // namespace troupe::layers
