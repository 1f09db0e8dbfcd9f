#pragma once

// A fresh directory named after the running test, for tests that read and write files.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace troupe::layers {

/// Created empty when constructed, removed with everything in it when destroyed.
class temp_directory {
 public:
  temp_directory() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("troupe_layers_test_" + std::to_string(getpid()) + "_" + test->test_suite_name() +
             "_" + test->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_directory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  temp_directory(const temp_directory&) = delete;
  temp_directory& operator=(const temp_directory&) = delete;

  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  /// Writes `contents` to the file `name` and gives its path.
  std::string write(const std::string& name, const std::string& contents) const {
    std::ofstream(file(name), std::ios::binary) << contents;
    return file(name);
  }

 private:
  std::filesystem::path path_;
};

}  // namespace troupe::layers
