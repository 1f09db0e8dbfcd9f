#include "apps/local_workers.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

extern char** environ;

namespace troupe::apps {
namespace {

// The children of the current run, for the signal handler (async-signal-safe access only).
constexpr int max_children = 256;
std::atomic<pid_t> running_children[max_children];

void stop_children_and_exit(int signal_number) {
  for (auto& child : running_children) {
    const pid_t pid = child.load();
    if (pid > 0) kill(pid, SIGTERM);
  }
  _exit(128 + signal_number);
}

void install_handlers() {
  struct sigaction action {};
  action.sa_handler = stop_children_and_exit;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

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

}  // namespace

local_workers::local_workers() {
  char pattern[] = "/tmp/troupe-XXXXXX";
  const char* made = mkdtemp(pattern);
  directory_ = made ? made : "/tmp";
}

local_workers::~local_workers() {
  reap(5.0);
  std::error_code ignored;
  if (directory_ != "/tmp") std::filesystem::remove_all(directory_, ignored);
}

bool local_workers::start(int count, std::string* error) {
  install_handlers();
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string coordinator = coordinator_address();
  for (int i = 0; i < count; ++i) {
    const std::string listen = "ipc://" + directory_ + "/worker-" + std::to_string(i);
    std::vector<std::string> arguments = {self,        "worker",   "--coordinator",
                                          coordinator, "--listen", listen};
    std::vector<char*> argv;
    for (auto& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int failure = posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ);
    if (failure != 0) {
      *error = "cannot start worker " + std::to_string(i) + ": " + std::strerror(failure);
      return false;
    }
    children_.push_back(pid);
    remember(pid);
  }
  return true;
}

void local_workers::reap(double grace_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  while (!children_.empty()) {
    for (size_t i = 0; i < children_.size();) {
      int status = 0;
      if (waitpid(children_[i], &status, WNOHANG) == children_[i]) {
        forget(children_[i]);
        children_.erase(children_.begin() + i);
      } else {
        ++i;
      }
    }
    if (children_.empty()) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (pid_t pid : children_) kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace troupe::apps
