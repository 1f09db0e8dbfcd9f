// The ring all-reduce machine: every rank ends with the same sum, whatever order the ranks'
// messages are delivered in, and a chunk that does not fit changes nothing.

#include "actors/engine/ring_all_reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <memory>
#include <random>
#include <vector>

namespace troupe::actors {
namespace {

/// Contributions of `ranks` ranks of `length` values, distinct per rank and position.
std::vector<std::vector<float>> contributions(int ranks, int64_t length, int round) {
  std::vector<std::vector<float>> values(ranks, std::vector<float>(length));
  for (int r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < length; ++i) {
      values[r][i] = std::sin(0.37f * static_cast<float>(i + 1) * static_cast<float>(r + 2) +
                              static_cast<float>(round));
    }
  }
  return values;
}

/// Runs `rounds` rounds among `ranks` ranks; the ranks start in a random order and the
/// queued chunks are delivered in a random order: each link's oldest first (`fifo`, as a
/// socket keeps them), or any of them.
void run_rounds(int ranks, int64_t length, int rounds, uint32_t seed, int64_t piece_floats,
                bool fifo = true) {
  std::mt19937 random(seed);
  std::vector<ring_all_reduce> ring;
  for (int r = 0; r < ranks; ++r) ring.emplace_back(r, ranks, length, piece_floats);
  for (int round = 0; round < rounds; ++round) {
    const auto inputs = contributions(ranks, length, round);
    std::vector<std::deque<ring_chunk>> links(ranks);  // link r: from rank r to r + 1
    std::vector<bool> started(ranks, false);
    std::vector<std::vector<float>> results(ranks);
    int finished = 0;
    while (finished < ranks) {
      // Either a rank that has not started starts, or a link delivers its oldest chunk.
      std::vector<int> choices;
      for (int r = 0; r < ranks; ++r) {
        if (!started[r]) choices.push_back(r);
        if (!links[r].empty()) choices.push_back(ranks + r);
      }
      ASSERT_FALSE(choices.empty()) << "the ring stalled";
      const int choice = choices[random() % choices.size()];
      std::vector<ring_chunk> sent;
      int rank;
      if (choice < ranks) {
        rank = choice;
        started[rank] = true;
        sent = ring[rank].start(inputs[rank]);
      } else {
        rank = (choice - ranks + 1) % ranks;
        std::deque<ring_chunk>& link = links[choice - ranks];
        const size_t which = fifo ? 0 : random() % link.size();
        const ring_chunk chunk = link[which];
        link.erase(link.begin() + static_cast<std::ptrdiff_t>(which));
        std::string error;
        ASSERT_TRUE(ring[rank].receive(chunk, &sent, &error)) << error;
      }
      for (const ring_chunk& chunk : sent) links[rank].push_back(chunk);
      if (ring[rank].finished()) {
        results[rank] = ring[rank].take_result();  // a copy: the buffer is reused
        ++finished;
      }
    }
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(results[r], results[0]) << "rank " << r << " differs, round " << round;
      EXPECT_TRUE(links[r].empty());
    }
    for (int64_t i = 0; i < length; ++i) {
      double sum = 0;
      for (int r = 0; r < ranks; ++r) sum += inputs[r][i];
      EXPECT_NEAR(results[0][i], sum, 1e-5) << "value " << i;
    }
  }
  for (const ring_all_reduce& rank : ring) EXPECT_EQ(rank.rounds(), rounds);
}

TEST(RingAllReduceTest, EveryRankEndsWithTheSameSum) {
  for (int ranks : {1, 2, 3, 5}) {
    for (int64_t length : {0, 1, 4, 103}) {
      for (int64_t piece : {int64_t{1} << 20, int64_t{7}, int64_t{1}}) {
        for (uint32_t seed : {1u, 2u, 3u}) {
          SCOPED_TRACE("ranks " + std::to_string(ranks) + " length " + std::to_string(length) +
                       " piece " + std::to_string(piece));
          run_rounds(ranks, length, 3, seed, piece);
          run_rounds(ranks, length, 3, seed, piece, false);
        }
      }
    }
  }
}

TEST(RingAllReduceTest, LargeChunksTravelInPieces) {
  ring_all_reduce rank(0, 2, 1000, 100);  // chunks of 500 floats, in 5 pieces
  EXPECT_EQ(rank.pieces(), 5);
  const std::vector<ring_chunk> sent = rank.start(std::vector<float>(1000, 1.f));
  ASSERT_EQ(sent.size(), 5u);
  for (int p = 0; p < 5; ++p) {
    EXPECT_EQ(sent[p].piece, p);
    EXPECT_EQ(sent[p].step, 0);
    EXPECT_EQ(sent[p].values.count, 100);
  }
}

TEST(RingAllReduceTest, EachRankSendsTwiceItsShareOfTheBuffer) {
  ring_all_reduce rank(1, 4, 1000);
  // 2 (R - 1) / R of 1000 floats.
  EXPECT_EQ(rank.bytes_sent_per_round(), 1500 * 4);
}

TEST(RingAllReduceTest, ChunksThatDoNotFitAreRefused) {
  ring_all_reduce rank(0, 3, 9);
  std::vector<ring_chunk> sent;
  std::string error;
  auto values = [](size_t count) {
    return float_view::of(std::make_shared<const std::vector<float>>(count, 1.f));
  };
  // Before this rank starts: an all-gather step, a wrong size, two rounds ahead, no values,
  // a piece that does not exist.
  EXPECT_FALSE(rank.receive({0, 2, 0, values(3)}, &sent, &error));
  EXPECT_NE(error.find("all-gather"), std::string::npos) << error;
  EXPECT_FALSE(rank.receive({0, 0, 0, values(4)}, &sent, &error));
  EXPECT_NE(error.find("4 values"), std::string::npos) << error;
  EXPECT_FALSE(rank.receive({2, 0, 0, values(3)}, &sent, &error));
  EXPECT_FALSE(rank.receive({0, 0, 0, float_view{nullptr, nullptr, 3}}, &sent, &error));
  EXPECT_FALSE(rank.receive({0, 0, 1, values(3)}, &sent, &error));  // one piece only
  EXPECT_NE(error.find("piece 1"), std::string::npos) << error;
  EXPECT_TRUE(sent.empty());
  // Fitting early chunks wait, in any order, and are taken when the rank starts; a second
  // copy of one is refused.
  EXPECT_TRUE(rank.receive({0, 1, 0, values(3)}, &sent, &error)) << error;
  EXPECT_TRUE(rank.receive({0, 0, 0, values(3)}, &sent, &error)) << error;
  EXPECT_FALSE(rank.receive({0, 0, 0, values(3)}, &sent, &error));
  EXPECT_NE(error.find("already"), std::string::npos) << error;
  sent = rank.start(std::vector<float>(9, 2.f));
  // Its own chunk, the sum it made of the first early one, then of the second.
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_EQ(sent[1].step, 1);
  EXPECT_EQ(sent[1].values.to_vector(), std::vector<float>(3, 3.f));
  EXPECT_EQ(sent[2].step, 2);
  EXPECT_EQ(sent[2].values.to_vector(), std::vector<float>(3, 3.f));
  EXPECT_TRUE(rank.under_way());
}

}  // namespace
}  // namespace troupe::actors
