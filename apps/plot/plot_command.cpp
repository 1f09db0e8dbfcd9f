// `troupe plot`: runs apps/plot/troupe_plot.py, which draws the figures with matplotlib.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "apps/cli/commands.h"

namespace troupe::apps {
namespace {

/// The script: $TROUPE_PLOT_SCRIPT, else the copy beside this executable (build tree), else the
/// installed copy (PREFIX/share/troupe), else the source tree's. Empty, with a message in
/// `*problem`, when none exists.
std::string plot_script(std::string* problem) {
  std::error_code error;
  if (const char* given = std::getenv("TROUPE_PLOT_SCRIPT"); given && *given) {
    if (std::filesystem::is_regular_file(given, error)) return given;
    *problem = std::string("TROUPE_PLOT_SCRIPT names ") + given + ", which is not a file";
    return "";
  }
  const std::filesystem::path executable = std::filesystem::read_symlink("/proc/self/exe", error);
  std::vector<std::filesystem::path> candidates;
  if (!error) {
    candidates.push_back(executable.parent_path() / "troupe_plot.py");
    candidates.push_back(executable.parent_path().parent_path() / "share/troupe/troupe_plot.py");
  }
  candidates.push_back(TROUPE_PLOT_SCRIPT_SOURCE);
  for (const std::filesystem::path& candidate : candidates) {
    if (std::filesystem::is_regular_file(candidate, error)) return candidate.string();
  }
  *problem =
      "cannot find troupe_plot.py beside this executable or in the source tree; set "
      "TROUPE_PLOT_SCRIPT to its path";
  return "";
}

/// Runs `arguments` (argv[0] looked up on PATH), without a shell, and waits for it. Its exit
/// status; 127 when it could not be started, 128 + N when signal N ended it. With `quiet` its
/// standard output and error go to /dev/null.
int run_program(std::vector<std::string> arguments, bool quiet) {
  std::vector<char*> argv;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (quiet) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t child = 0;
  const int spawned = posix_spawnp(&child, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return 127;
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) return 127;
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/// A Python 3 that can import matplotlib: $TROUPE_PYTHON, else python3 on PATH, else Debian's
/// /usr/bin/python3 (where python3-matplotlib installs, when another python3 comes first on
/// PATH). Nothing when none can; `*found_python` says whether any interpreter ran at all.
std::optional<std::string> python_with_matplotlib(bool* found_python) {
  std::vector<std::string> candidates = {"python3", "/usr/bin/python3"};
  if (const char* given = std::getenv("TROUPE_PYTHON"); given && *given) candidates = {given};
  *found_python = false;
  for (const std::string& python : candidates) {
    const int status = run_program({python, "-c", "import matplotlib"}, true);
    if (status == 0) return python;
    if (status != 127) *found_python = true;
  }
  return std::nullopt;
}

std::vector<std::string> script_arguments(const plot_options& options) {
  std::vector<std::string> arguments = {"--out", options.out_directory};
  for (const std::string& label : options.labels) {
    arguments.push_back("--label");
    arguments.push_back(label);
  }
  if (!options.window.empty()) {
    arguments.push_back("--window");
    arguments.push_back(options.window);
  }
  arguments.push_back("--");  // a run directory named like an option stays a directory
  arguments.insert(arguments.end(), options.run_directories.begin(), options.run_directories.end());
  return arguments;
}

}  // namespace

int run_plot(const plot_options& options) {
  std::string problem;
  const std::string script = plot_script(&problem);
  if (script.empty()) {
    std::fprintf(stderr, "troupe plot: %s\n", problem.c_str());
    return 1;
  }
  bool found_python = false;
  const std::optional<std::string> python = python_with_matplotlib(&found_python);
  if (!python) {
    std::fprintf(stderr, "troupe plot needs %s: apt-get install python3-matplotlib\n",
                 found_python ? "python3-matplotlib" : "python3 and python3-matplotlib");
    return 1;
  }
  std::vector<std::string> arguments = {*python, script};
  const std::vector<std::string> rest = script_arguments(options);
  arguments.insert(arguments.end(), rest.begin(), rest.end());
  const int status = run_program(arguments, false);
  if (status == 127) std::fprintf(stderr, "troupe plot: cannot start %s\n", python->c_str());
  return status;
}

}  // namespace troupe::apps
