#pragma once

// Running the `troupe` binary from tests: a fixture with a private directory, commands run to
// completion with their output captured, and commands started in the background.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/polling.h"

extern char** environ;

namespace troupe::testing {

namespace fs = std::filesystem;

struct run_result {
  int status = -1;
  std::string errors;
  std::string output;
};

inline std::string read_file(const fs::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

/// The [data] section of a synthetic 4-class set.
inline std::string synthetic_data(int64_t train, int64_t test) {
  return "[data]\ndataset = \"synthetic\"\nsynthetic_train = " + std::to_string(train) +
         "\nsynthetic_test = " + std::to_string(test) + "\nclasses = 4\n";
}

/// The [model] section of the 8-16-16-4 MLP whose hidden activations are `first`, `second`.
inline std::string mlp_model(const std::string& first, const std::string& second) {
  return "[model]\ninput_shape = [8]\nlayers = [{ type = \"linear\", out = 16 }, { type = \"" +
         first + "\" }, { type = \"linear\", out = 16 },\n          { type = \"" + second +
         "\" }, { type = \"linear\", out = 4 }]\n";
}

/// The MLP of mlp_model("tanh", "relu") on `stages` stages in sync mode, 2 micro-batches, Adam,
/// 16 steps an epoch for 2 epochs, with a checkpoint every 8 steps.
inline std::string checkpointed_sync_job(int stages) {
  return mlp_model("tanh", "relu") + synthetic_data(512, 128) +
         "[parallelism]\nstages = " + std::to_string(stages) + R"(
micro_batches = 2
[training]
batch_size = 32
epochs = 2
lr = 0.05
optimizer = "adam"
[checkpoint]
interval_steps = 8
keep_last = 10
[metrics]
log_interval = 4
)";
}

class troupe_command_test : public ::testing::Test {
 protected:
  void SetUp() override {
    // A directory of this test's own: ctest runs tests in processes of their own, several at once.
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    directory_ =
        fs::temp_directory_path() / ("troupe_cli_" + std::string(info->test_suite_name()) + "_" +
                                     info->name() + "_" + std::to_string(::getpid()));
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

  /// Exit status 2 and exactly one line on stderr, which contains `needle`.
  static void expect_one_line(const run_result& result, const std::string& needle) {
    EXPECT_EQ(result.status, 2) << result.errors;
    EXPECT_NE(result.errors.find(needle), std::string::npos) << result.errors;
    EXPECT_EQ(std::count(result.errors.begin(), result.errors.end(), '\n'), 1) << result.errors;
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
)" + synthetic_data(512, 128) + R"(
[training]
batch_size = 32
epochs = 2
lr = 0.1
target_accuracy = 0.3
[metrics]
log_interval = 4
)");
  }

  fs::path directory_;
};

/// Starts `troupe ARGUMENTS...` in the background with stderr to `errors`; with
/// `own_process_group`, in a process group of its own (its pid), which its workers join, as a
/// launcher's tasks are signalled together.
inline pid_t spawn_troupe(const std::vector<std::string>& arguments, const fs::path& errors,
                          bool own_process_group = false) {
  std::vector<std::string> all = {TROUPE_BINARY};
  all.insert(all.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (auto& argument : all) argv.push_back(argument.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, errors.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  if (own_process_group) {
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
  }
  pid_t pid = 0;
  posix_spawn(&pid, TROUPE_BINARY, &actions, &attributes, argv.data(), environ);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

/// The running processes that `pid` started (its worker processes), from /proc.
inline std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> children;
  std::ifstream list("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  for (pid_t child; list >> child;) children.push_back(child);
  return children;
}

/// Polls until `done()` or `seconds` pass; returns done().
inline bool wait_until(const std::function<bool()>& done, double seconds) {
  eventually(done, std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  return done();
}

}  // namespace troupe::testing
