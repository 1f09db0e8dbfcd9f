#include "apps/cli/local_workers.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>
#include <utility>

extern char** environ;

namespace troupe::apps {
namespace {

// The children of the current run, for the signal handler (async-signal-safe access only).
constexpr int max_children = 256;
std::atomic<pid_t> running_children[max_children];

void remember(pid_t pid) {
  for (auto& child : running_children) {
    pid_t empty = 0;
    if (child.compare_exchange_strong(empty, pid)) return;
  }
}

void forget(pid_t pid) {
  for (auto& child : running_children) {
    pid_t expected = pid;
    child.compare_exchange_strong(expected, 0);
  }
}

/// "exited with status 1", "was killed by signal 9 (Killed)".
std::string how_it_ended(int status) {
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const char* name = strsignal(signal);
    return "was killed by signal " + std::to_string(signal) +
           (name ? std::string(" (") + name + ")" : "");
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

std::string fresh_run_secret() {
  std::random_device entropy;  // the kernel's random source
  std::string secret;
  char digits[9];
  for (int i = 0; i < 4; ++i) {
    std::snprintf(digits, sizeof digits, "%08x", static_cast<unsigned>(entropy()));
    secret += digits;
  }
  return secret;
}

std::string run_secret_from_environment() {
  const char* value = std::getenv(run_secret_variable);
  return value ? value : "";
}

local_workers::local_workers() : secret_(fresh_run_secret()) {
  char pattern[] = "/tmp/troupe-XXXXXX";
  const char* made = mkdtemp(pattern);
  directory_ = made ? made : "/tmp";
}

local_workers::~local_workers() {
  reap(5.0);
  std::error_code ignored;
  if (directory_ != "/tmp") std::filesystem::remove_all(directory_, ignored);
}

void local_workers::terminate_all() {
  for (auto& child : running_children) {
    const pid_t pid = child.load();
    if (pid > 0) kill(pid, SIGKILL);
  }
}

bool local_workers::spawn_worker(std::string* error) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const int index = started_++;
  // A fresh address per worker: a replacement never meets its predecessor's leftovers.
  const std::string listen = "ipc://" + directory_ + "/worker-" + std::to_string(index);
  std::vector<std::string> arguments = {
      self, "worker", "--coordinator", coordinator_address(), "--listen", listen};
  std::vector<char*> argv;
  for (auto& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  // The secret goes in the environment, which only this user and root can read, not on the
  // command line, which every process can.
  std::vector<std::string> variables = {std::string(run_secret_variable) + "=" + secret_};
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::strncmp(*entry, run_secret_variable, std::strlen(run_secret_variable)) != 0 ||
        (*entry)[std::strlen(run_secret_variable)] != '=')
      variables.emplace_back(*entry);
  }
  std::vector<char*> environment;
  for (auto& variable : variables) environment.push_back(variable.data());
  environment.push_back(nullptr);
  pid_t pid = 0;
  const int failure =
      posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environment.data());
  if (failure != 0) {
    *error = "cannot start worker " + std::to_string(index) + ": " + std::strerror(failure);
    return false;
  }
  children_.push_back(pid);
  remember(pid);
  return true;
}

bool local_workers::start(int count, std::string* error) {
  for (int i = 0; i < count; ++i) {
    if (!spawn_worker(error)) return false;
  }
  return true;
}

void local_workers::reap_exited() {
  for (size_t i = 0; i < children_.size();) {
    int status = 0;
    if (waitpid(children_[i], &status, WNOHANG) == children_[i]) {
      exited_.push_back({children_[i], how_it_ended(status)});
      forget(children_[i]);
      children_.erase(children_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

std::vector<actors::exited_worker> local_workers::collect_exited() {
  reap_exited();
  return std::exchange(exited_, {});
}

bool local_workers::start_replacement(std::string* error) {
  reap_exited();
  return spawn_worker(error);
}

void local_workers::reap(double grace_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (!children_.empty()) {
    reap_exited();
    if (children_.empty()) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t pid : children_) kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace troupe::apps
