#pragma once

// Holds threads until a fixed number have arrived, again and again (C++20's std::barrier, for
// C++17).

#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace troupe::layers {

class thread_barrier {
 public:
  explicit thread_barrier(int parties) : parties_(parties) {}

  /// Blocks until `parties` threads have called it since the last time they all had.
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t generation = generation_;
    if (++arrived_ == parties_) {
      arrived_ = 0;
      ++generation_;
      all_arrived_.notify_all();
      return;
    }
    all_arrived_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  const int parties_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

}  // namespace troupe::layers
