// The coordinator's rounds with every stage, driven with no threads: a save round completes
// with every stage's state in stage order whatever order they answer in, refuses what it does
// not wait for, and ends on a bad answer; a load round takes acknowledgements.

#include "actors/engine/checkpoint_round.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace troupe::actors {
namespace {

using arrival = checkpoint_round::arrival;
using purpose = checkpoint_round::purpose;

TEST(CheckpointRoundTest, ASaveRoundCollectsEveryStageInStageOrder) {
  checkpoint_round round(3);
  ASSERT_TRUE(round.begin(purpose::save, 40, 1.5));
  EXPECT_FALSE(round.begin(purpose::save, 41, 1.6)) << "one round at a time";
  EXPECT_TRUE(round.under_way());
  EXPECT_EQ(round.step(), 40);
  EXPECT_EQ(round.started_s(), 1.5);
  std::string problem;
  EXPECT_EQ(round.arrive(2, "two", &problem), arrival::waiting);
  EXPECT_EQ(round.arrive(2, "again", &problem), arrival::refused);
  EXPECT_EQ(problem, "an unexpected state message from stage 2");
  EXPECT_EQ(round.arrive(7, "seven", &problem), arrival::refused);
  EXPECT_TRUE(round.under_way()) << "a stray answer does not end the round";
  EXPECT_EQ(round.arrive(0, "zero", &problem), arrival::waiting);
  EXPECT_EQ(round.arrive(1, "one", &problem), arrival::complete);
  EXPECT_FALSE(round.under_way());
  EXPECT_EQ(round.take_states(), (std::vector<std::string>{"zero", "one", "two"}));
  EXPECT_EQ(round.arrive(0, "late", &problem), arrival::refused) << "no round waits for it";
}

TEST(CheckpointRoundTest, AnEmptyShardEndsTheRound) {
  checkpoint_round round(2);
  ASSERT_TRUE(round.begin(purpose::save, 8, 0));
  std::string problem;
  EXPECT_EQ(round.arrive(1, "", &problem), arrival::refused);
  EXPECT_EQ(problem, "stage 1 sent an empty shard");
  EXPECT_FALSE(round.under_way());
  EXPECT_TRUE(round.begin(purpose::save, 9, 0)) << "the next round can begin";
}

TEST(CheckpointRoundTest, ALoadRoundTakesAcknowledgementsAndAnAbandonedRoundNothingMore) {
  checkpoint_round round(2);
  ASSERT_TRUE(round.begin(purpose::load, 0, 0));
  std::string problem;
  EXPECT_EQ(round.arrive(0, "", &problem), arrival::waiting);
  EXPECT_EQ(round.arrive(1, "", &problem), arrival::complete);
  EXPECT_TRUE(round.take_states().empty());
  ASSERT_TRUE(round.begin(purpose::save, 5, 0));
  EXPECT_EQ(round.arrive(0, "zero", &problem), arrival::waiting);
  round.abandon();  // a worker was lost
  EXPECT_EQ(round.arrive(1, "one", &problem), arrival::refused);
  EXPECT_TRUE(round.begin(purpose::save, 5, 0));
}

}  // namespace
}  // namespace troupe::actors
