// eventually() polls with a deadline and sleeps between polls instead of spinning a core.

#include "tests/support/polling.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace troupe::testing {
namespace {

TEST(PollingTest, AWaitPollsAFewTimesAndGivesUpAtItsDeadline) {
  // Pauses of 50 µs doubling to 5 ms: 7 polls to reach 5 ms, then one per 5 ms at most (a
  // sleep never ends early), so 100 ms hold at most 7 + 20 polls and the last one at the
  // deadline. A wait that spun would poll millions of times.
  int polls = 0;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(eventually([&] { return ++polls < 0; }, std::chrono::milliseconds(100)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
  EXPECT_LE(polls, 7 + 20 + 2);
  EXPECT_GE(polls, 2);
}

TEST(PollingTest, ReturnsOnceThePredicateHolds) {
  std::atomic<bool> set{false};
  std::thread setter([&] { set = true; });
  EXPECT_TRUE(eventually([&] { return set.load(); }));
  setter.join();
  int polls = 0;
  EXPECT_TRUE(eventually([&] { return ++polls == 3; }));
  EXPECT_EQ(polls, 3);
}

}  // namespace
}  // namespace troupe::testing
