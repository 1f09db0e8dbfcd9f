#pragma once

// Waiting for something in a test by polling with a deadline, never by sleeping a fixed time.

#include <algorithm>
#include <chrono>
#include <thread>

namespace troupe::testing {

/// Polls `done` until it holds or `limit` passes; returns whether it held. Between polls the
/// thread sleeps, 50 µs at first and twice as long each time up to 5 ms, so that a wait leaves
/// the cores to the threads and processes it waits for instead of spinning on one.
template <class Predicate>
bool eventually(Predicate done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::chrono::microseconds pause(50);
  const std::chrono::microseconds longest_pause(5000);
  while (!done()) {
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) return false;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(2 * pause, longest_pause);
  }
  return true;
}

}  // namespace troupe::testing
