#include "layers/cpu/cpu_thread_pool.h"

#include <algorithm>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "layers/check.h"

namespace troupe::layers::cpu {
namespace {

/// About 50 microseconds of spinning before a worker goes to sleep.
constexpr int spin_iterations = 20000;

inline void pause() {
#if defined(__SSE2__)
  _mm_pause();
#endif
}

}  // namespace

thread_pool::thread_pool(int threads) {
  TROUPE_CHECK(threads >= 1);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void thread_pool::run(int parts, const std::function<void(int)>& work) {
  TROUPE_CHECK(parts >= 1 && parts <= threads());
  if (parts == 1) {
    work(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work_ = &work;
    parts_ = parts;
    remaining_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  work(0);
  while (remaining_.load(std::memory_order_acquire) > 0) pause();
}

bool thread_pool::wait_for_work(uint64_t seen) {
  for (int i = 0; i < spin_iterations; ++i) {
    if (generation_.load(std::memory_order_acquire) != seen) return !stopping_;
    pause();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [&] { return generation_.load() != seen; });
  return !stopping_;
}

void thread_pool::worker_loop(int index) {
  uint64_t seen = 0;
  while (wait_for_work(seen)) {
    const std::function<void(int)>* work;
    int parts;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seen = generation_.load();
      work = work_;
      parts = parts_;
    }
    if (index < parts) (*work)(index);
    remaining_.fetch_sub(1, std::memory_order_release);
  }
}

size_t split_point(size_t count, int parts, int part, size_t grain) {
  if (part >= parts) return count;
  const size_t blocks = (count + grain - 1) / grain;
  return std::min(count, blocks * part / parts * grain);
}

}  // namespace troupe::layers::cpu
