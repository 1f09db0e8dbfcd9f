#pragma once

// Every file troupe writes goes through this interface (LevelDB's Env lesson): checkpoints,
// safetensors, CURVE key files and a run's outputs. The POSIX implementation writes atomically
// (temporary file, fsync, rename, fsync of the directory). Tests use an in-memory one and a
// fault-injecting one (tests/support/file_system_fakes.h), which fails, or "crashes", at its Nth
// write: so a crash in the middle of a save is tested without a fault switch in the product.
//
// Paths are plain strings as the caller gives them. An implementation is safe for concurrent
// use by threads that touch different paths.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors {

class file_system {
 public:
  virtual ~file_system() = default;

  /// Replaces `path` with `pieces`, one after another, so that a reader, and a crash at any
  /// moment, finds either the old file or the whole new one: written to PATH.tmp, flushed to
  /// disk, renamed over `path`, and the directory flushed too (pieces spare a caller copying
  /// large tensors into one buffer). `mode` is the new file's permission bits. false, with
  /// `error` naming the path and what failed.
  virtual bool write_atomically(const std::string& path,
                                const std::vector<std::string_view>& pieces, std::string* error,
                                unsigned mode = 0644) = 0;
  /// write_atomically() of one piece.
  bool write_atomically(const std::string& path, std::string_view bytes, std::string* error,
                        unsigned mode = 0644) {
    return write_atomically(path, std::vector<std::string_view>{bytes}, error, mode);
  }
  /// Writes `bytes` to `path` (created or truncated) and flushes it to disk, without a rename:
  /// for files that a later atomic write commits (a checkpoint's shards, by its manifest).
  virtual bool write_synced(const std::string& path, std::string_view bytes,
                            std::string* error) = 0;
  /// Flushes `directory`'s entries (files created, renamed or removed in it) to disk.
  virtual bool sync_directory(const std::string& directory, std::string* error) = 0;
  /// The whole file; nothing, with `error` set, when it cannot be read.
  virtual std::optional<std::string> read(const std::string& path, std::string* error) = 0;
  /// The names of `directory`'s entries, sorted; empty when it does not exist.
  virtual std::vector<std::string> list(const std::string& directory) = 0;
  virtual bool exists(const std::string& path) = 0;
  virtual bool is_directory(const std::string& path) = 0;
  /// Creates `directory` and its missing parents, those it creates with permission bits `mode`.
  virtual bool create_directories(const std::string& directory, std::string* error,
                                  unsigned mode = 0755) = 0;
  /// Removes `path`, a file or a directory with everything in it; true when it is gone (or
  /// never was).
  virtual bool remove_all(const std::string& path, std::string* error) = 0;
};

/// The machine's own files (POSIX), shared by the whole process.
file_system& posix_files();

/// PATH.tmp: where write_atomically() puts the new bytes before the rename.
std::string temporary_path_of(const std::string& path);

}  // namespace troupe::actors
