#pragma once

// A reader's first check on a path it was given. Opening a FIFO to read blocks until a writer
// comes, and a device or socket never ends, so every reader of a manifest, a shard, a
// safetensors file, a profile or a data set asks here first and refuses anything but a
// regular file (symbolic links followed), naming the path and what it found.

#include <cstdint>
#include <string>

namespace troupe::layers {

/// "" when `path` is a regular file; otherwise why not, starting with the path:
/// "PATH: missing", "PATH: a FIFO, not a regular file", "PATH: cannot stat: REASON". It never
/// opens the path, so it never blocks.
std::string regular_file_problem(const std::string& path);

/// Opens `path` to read without blocking on a FIFO (O_NONBLOCK, O_CLOEXEC) and keeps the
/// descriptor only when it is a regular file: the descriptor (its size in `bytes` when given),
/// or -1 with `error` set as regular_file_problem() words it and `missing` (when given) telling
/// a path that does not exist from other failures. The caller closes it.
int open_regular_file(const std::string& path, std::string* error, uint64_t* bytes = nullptr,
                      bool* missing = nullptr);

}  // namespace troupe::layers
