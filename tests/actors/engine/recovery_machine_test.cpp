// Recovery from lost workers, driven with no threads: the restart budget, one recovery for
// losses that overlap, and the events the hosts report.

#include "actors/engine/recovery.h"

#include <gtest/gtest.h>

#include <string>

namespace troupe::actors {
namespace {

TEST(RecoveryMachineTest, EachLossSpendsARestartUntilTheBudgetIsGone) {
  recovery machine(2);
  nlohmann::json event;
  std::string reason;
  ASSERT_TRUE(machine.lost({{"address", "ipc:///w1"}}, {1, 2}, 10.0, &event, &reason));
  EXPECT_EQ(
      event,
      (nlohmann::json{
          {"event", "worker_lost"}, {"address", "ipc:///w1"}, {"stages", {1, 2}}, {"restart", 1}}));
  EXPECT_TRUE(machine.under_way());
  // A second loss while recovering is part of the same recovery: it began at the first.
  ASSERT_TRUE(machine.lost({{"device", "node0/gpu3"}}, {3}, 11.0, &event, &reason));
  EXPECT_EQ(event["restart"], 2);
  EXPECT_EQ(machine.lost_at_s(), 10.0);
  EXPECT_EQ(
      machine.recovered(40, 14.5),
      (nlohmann::json{
          {"event", "recovered"}, {"restart", 2}, {"resumed_from_step", 40}, {"seconds", 4.5}}));
  EXPECT_FALSE(machine.under_way());
  EXPECT_FALSE(machine.lost({{"address", "ipc:///w2"}}, {0}, 20.0, &event, &reason));
  EXPECT_EQ(reason, "after 2 restarts (checkpoint.max_restarts = 2)");
  EXPECT_EQ(machine.restarts(), 2);
}

TEST(RecoveryMachineTest, NoBudgetMeansTheFirstLossEndsTheRun) {
  recovery machine(0);
  nlohmann::json event;
  std::string reason;
  EXPECT_FALSE(machine.lost({}, {0}, 1.0, &event, &reason));
  EXPECT_EQ(reason, "after 0 restarts (checkpoint.max_restarts = 0)");
  EXPECT_FALSE(machine.under_way());
}

}  // namespace
}  // namespace troupe::actors
