#include "actors/storage/file_system.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "actors/storage/file_descriptor.h"
#include "layers/regular_file.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

/// Writes go in pieces of this size (a write() of over 2 GiB is cut short by Linux anyway).
constexpr size_t write_chunk = size_t{64} << 20;

bool fail(std::string* error, const std::string& path, const char* what, int number) {
  *error = path + ": " + what + ": " + std::strerror(number);
  return false;
}

/// The directory that holds `path` ("." for a bare name).
std::string directory_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

bool write_file(const std::string& path, const std::vector<std::string_view>& pieces, unsigned mode,
                std::string* error) {
  file_descriptor file(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (file.get() < 0) return fail(error, path, "cannot create", errno);
  // The mode is set on the descriptor, so a secret key is never readable by others, not even
  // for a moment, whatever the umask.
  if (::fchmod(file.get(), mode) != 0) return fail(error, path, "cannot set its mode", errno);
  for (std::string_view bytes : pieces) {
    const char* data = bytes.data();
    size_t left = bytes.size();
    while (left > 0) {
      const ssize_t written = ::write(file.get(), data, std::min(left, write_chunk));
      if (written < 0 && errno == EINTR) continue;
      if (written < 0) return fail(error, path, "cannot write", errno);
      data += written;
      left -= static_cast<size_t>(written);
    }
  }
  if (::fsync(file.get()) != 0) return fail(error, path, "cannot sync", errno);
  if (file.close() != 0) return fail(error, path, "cannot close", errno);
  return true;
}

class posix_file_system final : public file_system {
 public:
  using file_system::write_atomically;
  bool write_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                        std::string* error, unsigned mode) override {
    const std::string temporary = temporary_path_of(path);
    if (!write_file(temporary, pieces, mode, error)) {
      ::unlink(temporary.c_str());
      return false;
    }
    if (::rename(temporary.c_str(), path.c_str()) != 0) {
      const int number = errno;
      ::unlink(temporary.c_str());
      return fail(error, path, "cannot rename the temporary file into place", number);
    }
    return sync_directory(directory_of(path), error);
  }

  bool write_synced(const std::string& path, std::string_view bytes, std::string* error) override {
    return write_file(path, {bytes}, 0644, error);
  }

  bool sync_directory(const std::string& directory, std::string* error) override {
    file_descriptor handle(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (handle.get() < 0) return fail(error, directory, "cannot open directory", errno);
    if (::fsync(handle.get()) != 0) return fail(error, directory, "cannot sync directory", errno);
    return true;
  }

  std::optional<std::string> read(const std::string& path, std::string* error) override {
    std::string problem;
    file_descriptor file(layers::open_regular_file(path, &problem));
    if (file.get() < 0) {
      if (error) *error = problem;
      return std::nullopt;
    }
    std::string bytes;
    char buffer[1 << 16];
    for (;;) {
      const ssize_t count = ::read(file.get(), buffer, sizeof buffer);
      if (count < 0 && errno == EINTR) continue;
      if (count < 0) {
        fail(error, path, "cannot read", errno);
        return std::nullopt;
      }
      if (count == 0) return bytes;
      bytes.append(buffer, static_cast<size_t>(count));
    }
  }

  std::vector<std::string> list(const std::string& directory) override {
    std::vector<std::string> names;
    std::error_code failure;
    for (fs::directory_iterator it(directory, failure), end; !failure && it != end;
         it.increment(failure)) {
      names.push_back(it->path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  bool exists(const std::string& path) override {
    std::error_code ignored;
    return fs::exists(path, ignored);
  }

  bool is_directory(const std::string& path) override {
    std::error_code ignored;
    return fs::is_directory(path, ignored);
  }

  bool create_directories(const std::string& directory, std::string* error,
                          unsigned mode) override {
    std::error_code failure;
    const bool created = fs::create_directories(directory, failure);
    if (created && !failure) {
      fs::permissions(directory, static_cast<fs::perms>(mode), fs::perm_options::replace, failure);
    }
    if (!failure) return true;
    *error = directory + ": cannot create: " + failure.message();
    return false;
  }

  bool remove_all(const std::string& path, std::string* error) override {
    std::error_code failure;
    fs::remove_all(path, failure);
    if (!failure) return true;
    *error = path + ": cannot remove: " + failure.message();
    return false;
  }
};

}  // namespace

file_system& posix_files() {
  static posix_file_system files;
  return files;
}

std::string temporary_path_of(const std::string& path) { return path + ".tmp"; }

}  // namespace troupe::actors
