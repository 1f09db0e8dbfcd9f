#pragma once

// Memory blocks kept by size for reuse once returned. A training step allocates the same shapes
// every time; handing a returned block out again spares the allocator's system calls and, on the
// CPU, the page faults of memory the kernel maps afresh for every large allocation.

#include <cstddef>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace troupe::layers {

/// Blocks returned from any thread, kept by their exact size until taken again or drained; at
/// most `limit` bytes are kept (a block beyond it is forgotten, for its owner to release).
class block_cache {
 public:
  explicit block_cache(size_t limit = std::numeric_limits<size_t>::max()) : limit_(limit) {}

  /// A returned block of exactly `size` bytes, handed out again; null when there is none.
  void* take(size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = free_.find(size);
    if (found == free_.end() || found->second.empty()) return nullptr;
    void* block = found->second.back();
    found->second.pop_back();
    free_bytes_ -= size;
    return block;
  }
  /// Notes a newly allocated block of `size` bytes.
  void add(void* block, size_t size) {
    std::lock_guard<std::mutex> lock(mutex_);
    sizes_[block] = size;
  }
  /// Returns a block that add() noted, for take() to hand out again. False when add() never
  /// noted it, or when keeping it would pass the limit (the block is then forgotten): either
  /// way its owner releases it.
  bool give_back(void* block) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = sizes_.find(block);
    if (found == sizes_.end()) return false;
    const size_t size = found->second;
    if (size > limit_ - free_bytes_) {
      sizes_.erase(found);
      return false;
    }
    free_[size].push_back(block);
    free_bytes_ += size;
    return true;
  }
  /// Forgets every returned block, passing each to `release` (blocks still out stay noted).
  template <typename function>
  void drain(function release) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& entry : free_) {
      for (void* block : entry.second) {
        sizes_.erase(block);
        release(block);
      }
    }
    free_.clear();
    free_bytes_ = 0;
  }

 private:
  const size_t limit_;
  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;              // every block noted
  std::unordered_map<size_t, std::vector<void*>> free_;  // returned ones, by size
  size_t free_bytes_ = 0;
};

}  // namespace troupe::layers
