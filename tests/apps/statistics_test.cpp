// The commands' statistics: spreads, and how a prediction ranks repeated measurements.

#include "apps/lab/statistics.h"

#include <gtest/gtest.h>

#include <vector>

namespace troupe::apps {
namespace {

TEST(StatisticsTest, SpreadIsTheLargestOverTheSmallestLessOne) {
  EXPECT_DOUBLE_EQ(spread({2.0, 3.0, 2.5}), 0.5);
  EXPECT_DOUBLE_EQ(spread({4.0}), 0.0);
  EXPECT_DOUBLE_EQ(spread({0.0, 5.0}), 0.0);  // a value of 0 was not measured
}

TEST(StatisticsTest, RankingCountsPairsOrderedAsMeasuredAndThoseToldApartBeyondTheirSpread) {
  // Settings 0 and 1 measured far apart; 1 and 2 overlapping, with medians 20 and 21.
  const std::vector<std::vector<double>> measured = {{30, 31, 32}, {19, 20, 22}, {20, 21, 23}};
  ranking_agreement same = compare_rankings(measured, {{33}, {20}, {21}});
  EXPECT_EQ(same.pairs, 3);
  EXPECT_EQ(same.agreeing, 3);
  EXPECT_EQ(same.apart, 2);  // 0 with 1, 0 with 2
  EXPECT_EQ(same.apart_agreeing, 2);
  EXPECT_TRUE(same.disagreeing.empty());

  // The close pair swapped: one disagreement, among the pairs the runs' spread does not settle.
  ranking_agreement swapped = compare_rankings(measured, {{33}, {21.5}, {21}});
  EXPECT_EQ(swapped.pairs, 3);
  EXPECT_EQ(swapped.agreeing, 2);
  EXPECT_EQ(swapped.apart_agreeing, 2);
  ASSERT_EQ(swapped.disagreeing.size(), 1u);
  EXPECT_EQ(swapped.disagreeing[0].i, 1u);
  EXPECT_EQ(swapped.disagreeing[0].j, 2u);
  EXPECT_FALSE(swapped.disagreeing[0].apart);

  // A pair told apart and predicted the other way round counts against the apart ones too.
  ranking_agreement wrong = compare_rankings(measured, {{19}, {20}, {21}});
  EXPECT_EQ(wrong.apart, 2);
  EXPECT_EQ(wrong.apart_agreeing, 0);
  ASSERT_EQ(wrong.disagreeing.size(), 2u);
  EXPECT_TRUE(wrong.disagreeing[0].apart);

  // One run of five that crossed the target an evaluation early does not join two settings.
  const std::vector<std::vector<double>> with_outlier = {{15.8, 31.0, 31.4, 32.0, 35.8},
                                                         {19.2, 19.3, 20.2, 20.5, 21.6}};
  EXPECT_EQ(compare_rankings(with_outlier, {{31}, {20}}).apart, 1);
  EXPECT_EQ(compare_rankings({{15.8, 31.0, 32.0}, {19.2, 20.2, 21.6}}, {{31}, {20}}).apart, 0);

  // Ties and settings without values (diverged, or never reaching the target) are not ranked.
  ranking_agreement partial = compare_rankings({{30}, {}, {30}}, {{31}, {20}, {29}});
  EXPECT_EQ(partial.pairs, 0);
}

}  // namespace
}  // namespace troupe::apps
