#pragma once

// Waiting for something in a test by polling with a deadline, never by sleeping.

#include <chrono>
#include <thread>

namespace troupe::testing {

/// Polls `done` until it holds or `limit` passes; returns whether it held.
template <class Predicate>
bool eventually(Predicate done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace troupe::testing
