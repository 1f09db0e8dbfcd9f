#pragma once

// A POSIX file descriptor owned for its scope: the file layer and the checkpoint reader's.

#include <unistd.h>

#include <utility>

namespace troupe::actors {

/// Owns a file descriptor; close() reports the error that a deferred write may surface there.
class file_descriptor {
 public:
  explicit file_descriptor(int descriptor) : descriptor_(descriptor) {}
  ~file_descriptor() {
    if (descriptor_ >= 0) ::close(descriptor_);
  }
  file_descriptor(const file_descriptor&) = delete;
  file_descriptor& operator=(const file_descriptor&) = delete;
  int get() const { return descriptor_; }
  int close() { return ::close(std::exchange(descriptor_, -1)); }

 private:
  int descriptor_;
};

}  // namespace troupe::actors
