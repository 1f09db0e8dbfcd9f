#include "apps/cli/child_train.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace troupe::apps {

std::optional<nlohmann::json> train_in_child_process(const std::string& job_file,
                                                     const std::vector<std::string>& overrides,
                                                     int workers, const std::string& out) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::vector<std::string> arguments = {self, "train", job_file, "--out", out, "--quiet"};
  for (const std::string& setting : overrides) {
    arguments.push_back("--set");
    arguments.push_back(setting);
  }
  if (workers > 0) {
    arguments.push_back("--workers");
    arguments.push_back(std::to_string(workers));
  }
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::error_code ignored;
  std::filesystem::create_directories(out, ignored);
  const std::string log = out + "/train.log";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t child = 0;
  const int spawned = posix_spawn(&child, self.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return std::nullopt;
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  std::ifstream file(out + "/summary.json");
  nlohmann::json summary = nlohmann::json::parse(file, nullptr, false);
  if (summary.is_discarded()) return std::nullopt;
  return summary;
}

}  // namespace troupe::apps
