#pragma once

// Test doubles of actors::file_system: files in memory, and a wrapper that fails, or "crashes",
// at its Nth write (LevelDB's memenv and fault-injection Env).

#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "actors/storage/file_system.h"

namespace troupe::testing {

/// Files and directories in memory, with POSIX's rules where the tests can tell: a file is
/// written only into an existing directory, and a rename replaces its target at once.
class memory_file_system final : public actors::file_system {
 public:
  memory_file_system() { directories_.insert("/"); }

  using actors::file_system::write_atomically;
  bool write_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                        std::string* error, unsigned mode = 0644) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!parent_exists(path, error)) return false;
    std::string bytes;
    for (std::string_view piece : pieces) bytes.append(piece);
    files_[normal(path)] = std::move(bytes);
    modes_[normal(path)] = mode;
    return true;
  }
  bool write_synced(const std::string& path, std::string_view bytes, std::string* error) override {
    return write_atomically(path, std::vector<std::string_view>{bytes}, error);
  }
  bool sync_directory(const std::string& directory, std::string* error) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (directories_.count(normal(directory))) return true;
    *error = directory + ": no such directory";
    return false;
  }
  std::optional<std::string> read(const std::string& path, std::string* error) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = files_.find(normal(path));
    if (found != files_.end()) return found->second;
    *error = path + ": no such file";
    return std::nullopt;
  }
  std::vector<std::string> list(const std::string& directory) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string prefix = normal(directory) == "/" ? "/" : normal(directory) + "/";
    std::set<std::string> names;
    auto add = [&](const std::string& path) {
      if (path.size() <= prefix.size() || path.compare(0, prefix.size(), prefix) != 0) return;
      const std::string rest = path.substr(prefix.size());
      names.insert(rest.substr(0, rest.find('/')));
    };
    for (const auto& [path, bytes] : files_) add(path);
    for (const std::string& path : directories_) add(path);
    return {names.begin(), names.end()};
  }
  bool exists(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return files_.count(normal(path)) || directories_.count(normal(path));
  }
  bool is_directory(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return directories_.count(normal(path)) > 0;
  }
  bool create_directories(const std::string& directory, std::string*, unsigned = 0755) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (std::filesystem::path p = normal(directory); p != p.root_path(); p = p.parent_path())
      directories_.insert(p.string());
    return true;
  }
  bool remove_all(const std::string& path, std::string*) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string target = normal(path), prefix = target + "/";
    auto inside = [&](const std::string& p) { return p == target || p.rfind(prefix, 0) == 0; };
    for (auto it = files_.begin(); it != files_.end();)
      it = inside(it->first) ? files_.erase(it) : ++it;
    for (auto it = directories_.begin(); it != directories_.end();)
      it = inside(*it) ? directories_.erase(it) : ++it;
    return true;
  }
  /// The permission bits `path` was written with (0 when it was not).
  unsigned mode_of(const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = modes_.find(normal(path));
    return found == modes_.end() ? 0 : found->second;
  }

 private:
  static std::string normal(const std::string& path) {
    std::string text = std::filesystem::path("/" + path).lexically_normal().string();
    while (text.size() > 1 && text.back() == '/') text.pop_back();
    return text;
  }
  bool parent_exists(const std::string& path, std::string* error) {
    const std::string parent = std::filesystem::path(normal(path)).parent_path().string();
    if (directories_.count(parent)) return true;
    *error = path + ": no such directory";
    return false;
  }

  std::mutex mutex_;
  std::map<std::string, std::string> files_;
  std::map<std::string, unsigned> modes_;
  std::set<std::string> directories_;
};

/// Wraps another file system and, from its Nth write on (write_atomically and write_synced
/// count, from 1), fails or crashes. A failure is one write refused with an error, as a full
/// disk would. A crash is the process dying there: that write and everything after it, of any
/// kind, has no effect; with `leave_temporary` an atomic write dies after writing its temporary
/// file and before the rename.
class faulty_file_system final : public actors::file_system {
 public:
  enum class fault { none, fail, crash };

  explicit faulty_file_system(actors::file_system& inner) : inner_(inner) {}

  void fail_at_write(int write) { set(fault::fail, write, false); }
  void crash_at_write(int write, bool leave_temporary = false) {
    set(fault::crash, write, leave_temporary);
  }
  int writes() const { return writes_; }
  bool crashed() const { return crashed_; }

  using actors::file_system::write_atomically;
  bool write_atomically(const std::string& path, const std::vector<std::string_view>& pieces,
                        std::string* error, unsigned mode = 0644) override {
    if (!take_write(error)) {
      if (just_crashed_ && leave_temporary_) {
        std::string bytes, ignored;
        for (std::string_view piece : pieces) bytes.append(piece);
        inner_.write_synced(actors::temporary_path_of(path), bytes, &ignored);
      }
      just_crashed_ = false;
      return false;
    }
    return inner_.write_atomically(path, pieces, error, mode);
  }
  bool write_synced(const std::string& path, std::string_view bytes, std::string* error) override {
    const bool taken = take_write(error);
    just_crashed_ = false;
    return taken && inner_.write_synced(path, bytes, error);
  }
  bool sync_directory(const std::string& directory, std::string* error) override {
    return alive(error) && inner_.sync_directory(directory, error);
  }
  std::optional<std::string> read(const std::string& path, std::string* error) override {
    if (!alive(error)) return std::nullopt;
    return inner_.read(path, error);
  }
  std::vector<std::string> list(const std::string& directory) override {
    return inner_.list(directory);
  }
  bool exists(const std::string& path) override { return inner_.exists(path); }
  bool is_directory(const std::string& path) override { return inner_.is_directory(path); }
  bool create_directories(const std::string& directory, std::string* error,
                          unsigned mode = 0755) override {
    return alive(error) && inner_.create_directories(directory, error, mode);
  }
  bool remove_all(const std::string& path, std::string* error) override {
    return alive(error) && inner_.remove_all(path, error);
  }

 private:
  void set(fault kind, int write, bool leave_temporary) {
    fault_ = kind;
    fault_write_ = write;
    leave_temporary_ = leave_temporary;
  }
  bool alive(std::string* error) {
    if (!crashed_) return true;
    *error = "the process crashed (simulated) at write " + std::to_string(fault_write_);
    return false;
  }
  /// Counts a write; false (with `error`) when it is the one that fails or the process is dead.
  bool take_write(std::string* error) {
    if (!alive(error)) return false;
    if (++writes_ != fault_write_ || fault_ == fault::none) return true;
    if (fault_ == fault::crash) {
      crashed_ = just_crashed_ = true;
      return alive(error);
    }
    *error = "write " + std::to_string(writes_) + " failed (simulated): no space left on device";
    return false;
  }

  actors::file_system& inner_;
  fault fault_ = fault::none;
  int fault_write_ = 0;
  int writes_ = 0;
  bool leave_temporary_ = false;
  bool just_crashed_ = false;  ///< the write being taken is the one that crashed
  bool crashed_ = false;
};

}  // namespace troupe::testing
