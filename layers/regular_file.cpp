#include "layers/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace troupe::layers {
namespace {

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a special file";
}

std::string problem_of(const std::string& path, const struct stat& info) {
  if (S_ISREG(info.st_mode)) return "";
  return path + ": " + kind_of(info.st_mode) + ", not a regular file";
}

std::string errno_problem(const std::string& path, const char* what, int number) {
  if (number == ENOENT) return path + ": missing";
  return path + ": " + what + ": " + std::strerror(number);
}

}  // namespace

std::string regular_file_problem(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return errno_problem(path, "cannot stat", errno);
  return problem_of(path, info);
}

int open_regular_file(const std::string& path, std::string* error, uint64_t* bytes, bool* missing) {
  const int file = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (missing) *missing = file < 0 && errno == ENOENT;
  if (file < 0) {
    *error = errno_problem(path, "cannot open", errno);
    return -1;
  }
  struct stat info {};
  std::string problem = ::fstat(file, &info) != 0 ? errno_problem(path, "cannot stat", errno)
                                                  : problem_of(path, info);
  if (problem.empty()) {
    // A regular file's reads never block; the flag is cleared for callers that hand the
    // descriptor to stdio or zlib.
    const int flags = ::fcntl(file, F_GETFL);
    if (flags >= 0 && ::fcntl(file, F_SETFL, flags & ~O_NONBLOCK) == 0) {
      if (bytes) *bytes = static_cast<uint64_t>(info.st_size);
      return file;
    }
    problem = errno_problem(path, "cannot open", errno);
  }
  ::close(file);
  *error = problem;
  return -1;
}

}  // namespace troupe::layers
