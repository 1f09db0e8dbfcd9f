#include "sim/calibration/measuring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace troupe::sim {
namespace {

TEST(BalancedGroupsTest, HeavyStagesGoToDifferentGroups) {
  // The 4 stages of 784-1536x3-10: two light ones in front of two heavy ones. Neighbours in
  // pairs would put both heavy stages on one core.
  EXPECT_EQ(balanced_groups({16.3, 1.4, 41.2, 41.1}, 2), (std::vector<int>{1, 0, 0, 1}));
  EXPECT_EQ(balanced_groups({5, 5, 5, 5}, 2), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(balanced_groups({3, 1}, 1), (std::vector<int>{0, 0}));
}

TEST(BalancedGroupsTest, EveryGroupGetsAStageEvenAtNoCost) {
  EXPECT_EQ(balanced_groups({0, 0, 0}, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(balanced_groups({9, 0}, 2), (std::vector<int>{0, 1}));
}

TEST(RoundBarrierTest, GroupsKeepPaceAndStopTogether) {
  round_barrier barrier(2);
  std::atomic<int> light_rounds{0};
  int heavy_rounds = 0;
  // The light group would be done after 1 round, the heavy one after 5: both run 5, and at no
  // barrier has one group run a round more than the other.
  std::atomic<bool> out_of_step{false};
  std::thread light([&] {
    do {
      ++light_rounds;
    } while (!barrier.arrive_and_wait(true));
  });
  do {
    ++heavy_rounds;
    if (light_rounds.load() > heavy_rounds) out_of_step = true;
  } while (!barrier.arrive_and_wait(heavy_rounds >= 5));
  light.join();
  EXPECT_EQ(heavy_rounds, 5);
  EXPECT_EQ(light_rounds.load(), 5);
  EXPECT_FALSE(out_of_step.load());
}

}  // namespace
}  // namespace troupe::sim
