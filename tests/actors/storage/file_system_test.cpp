// The file layer's contract, held by the POSIX file system and by the in-memory test double
// alike, and the fault-injecting wrapper's failures and crashes.

#include "actors/storage/file_system.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>

#include "tests/support/file_system_fakes.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;
using testing::faulty_file_system;
using testing::memory_file_system;

/// Runs each test on the machine's files (in a fresh directory) and on memory.
class FileSystemContractTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      char pattern[] = "/tmp/troupe-files-XXXXXX";
      root_ = mkdtemp(pattern);
      files_ = &posix_files();
    } else {
      root_ = "/memory";
      memory_ = std::make_unique<memory_file_system>();
      files_ = memory_.get();
      std::string error;
      ASSERT_TRUE(files_->create_directories(root_, &error)) << error;
    }
  }
  void TearDown() override {
    if (GetParam()) fs::remove_all(root_);
  }
  std::string path(const std::string& name) const { return root_ + "/" + name; }

  std::string root_;
  std::unique_ptr<memory_file_system> memory_;
  file_system* files_ = nullptr;
};

TEST_P(FileSystemContractTest, AnAtomicWriteReplacesTheWholeFileAndLeavesNoTemporary) {
  std::string error;
  ASSERT_TRUE(files_->write_atomically(path("a.json"), "first", &error)) << error;
  ASSERT_TRUE(files_->write_atomically(path("a.json"), "second, longer", &error)) << error;
  EXPECT_EQ(files_->read(path("a.json"), &error), "second, longer");
  EXPECT_FALSE(files_->exists(temporary_path_of(path("a.json"))));
  EXPECT_EQ(files_->list(root_), std::vector<std::string>{"a.json"});
}

TEST_P(FileSystemContractTest, DirectoriesAreCreatedListedAndRemovedWithTheirContents) {
  std::string error;
  ASSERT_TRUE(files_->create_directories(path("x/y"), &error)) << error;
  ASSERT_TRUE(files_->write_synced(path("x/y/shard"), std::string("a\0b", 3), &error)) << error;
  ASSERT_TRUE(files_->write_synced(path("x/file"), "z", &error)) << error;
  ASSERT_TRUE(files_->sync_directory(path("x/y"), &error)) << error;
  EXPECT_EQ(files_->read(path("x/y/shard"), &error), std::string("a\0b", 3));
  EXPECT_EQ(files_->list(path("x")), (std::vector<std::string>{"file", "y"}));
  EXPECT_TRUE(files_->is_directory(path("x/y")));
  EXPECT_FALSE(files_->is_directory(path("x/file")));
  ASSERT_TRUE(files_->remove_all(path("x"), &error)) << error;
  EXPECT_FALSE(files_->exists(path("x/y/shard")));
  EXPECT_TRUE(files_->list(path("x")).empty());
  EXPECT_TRUE(files_->remove_all(path("never-was"), &error));
}

TEST_P(FileSystemContractTest, ErrorsNameThePath) {
  std::string error;
  EXPECT_FALSE(files_->read(path("missing"), &error));
  EXPECT_NE(error.find(path("missing")), std::string::npos) << error;
  EXPECT_FALSE(files_->write_atomically(path("no/such/dir/file"), "x", &error));
  EXPECT_NE(error.find(path("no/such/dir/file")), std::string::npos) << error;
}

INSTANTIATE_TEST_SUITE_P(PosixAndMemory, FileSystemContractTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "posix" : "memory"; });

TEST(FileSystemTest, AnAtomicWriteSetsTheModeOnTheFileItself) {
  char pattern[] = "/tmp/troupe-files-XXXXXX";
  const std::string root = mkdtemp(pattern);
  std::string error;
  ASSERT_TRUE(posix_files().write_atomically(root + "/secret.key", "k", &error, 0600)) << error;
  struct stat status {};
  ASSERT_EQ(::stat((root + "/secret.key").c_str(), &status), 0);
  EXPECT_EQ(status.st_mode & 0777, 0600u);
  fs::remove_all(root);
}

TEST(FileSystemTest, TheFaultyFileSystemFailsOneWriteOrCrashesForGood) {
  memory_file_system memory;
  std::string error;
  {
    faulty_file_system files(memory);
    files.fail_at_write(2);
    EXPECT_TRUE(files.write_synced("/a", "1", &error));
    EXPECT_FALSE(files.write_synced("/b", "2", &error));
    EXPECT_NE(error.find("no space left"), std::string::npos);
    EXPECT_TRUE(files.write_synced("/c", "3", &error)) << "a failure is one write";
    EXPECT_EQ(memory.list("/"), (std::vector<std::string>{"a", "c"}));
  }
  {
    faulty_file_system files(memory);
    files.crash_at_write(1, true);
    EXPECT_FALSE(files.write_atomically("/d", "4", &error));
    EXPECT_TRUE(files.crashed());
    EXPECT_FALSE(files.remove_all("/a", &error)) << "nothing happens after a crash";
    EXPECT_FALSE(files.create_directories("/e", &error));
    EXPECT_TRUE(memory.exists("/a"));
    EXPECT_FALSE(memory.exists("/d"));
    EXPECT_EQ(memory.read(temporary_path_of("/d"), &error), "4") << "died before the rename";
  }
}

}  // namespace
}  // namespace troupe::actors
