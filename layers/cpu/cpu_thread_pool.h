#pragma once

// The CPU backend's own worker threads. OpenBLAS is always called single-threaded; a backend
// that may use N cores splits each large operation into N parts and runs them here, one on
// the calling thread. So the number of cores a stage uses is a property of its backend, not
// of the process-wide OpenBLAS setting, and stages sharing a machine never oversubscribe it.

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::layers::cpu {

class thread_pool {
 public:
  /// `threads` in all, counting the caller: threads - 1 workers are started.
  explicit thread_pool(int threads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  /// Runs work(part) for every part in [0, parts), part 0 on the calling thread, and returns
  /// when all have finished. parts <= threads(). One caller at a time (the owning stage).
  void run(int parts, const std::function<void(int)>& work);

 private:
  void worker_loop(int index);
  /// Waits for a generation newer than `seen`: spins briefly (a step's operations follow each
  /// other within microseconds), then sleeps. Returns false when the pool is stopping.
  bool wait_for_work(uint64_t seen);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  std::atomic<bool> stopping_{false};
  const std::function<void(int)>* work_ = nullptr;
  int parts_ = 0;
};

/// Splits [0, count) into `parts` contiguous ranges whose boundaries are multiples of `grain`;
/// returns the start of range `part` (part == parts gives count).
size_t split_point(size_t count, int parts, int part, size_t grain);

}  // namespace troupe::layers::cpu
