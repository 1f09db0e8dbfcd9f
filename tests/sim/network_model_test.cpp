#include "sim/network_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <utility>
#include <vector>

namespace troupe::sim {
namespace {

using ids = std::vector<uint64_t>;

/// Relative tolerance for times and byte counts that went through a few divisions.
constexpr double kTolerance = 1e-9;

double next_finish(const network_model& model) {
  const std::optional<double> next = model.next_finish();
  EXPECT_TRUE(next.has_value());
  return next.value_or(-1);
}

TEST(NetworkModelTest, OneFlowFinishesAtBytesOverBandwidth) {
  network_model model({100});
  EXPECT_FALSE(model.next_finish().has_value());
  const uint64_t id = model.start(1, {0}, 250);
  EXPECT_EQ(id, 1u);
  EXPECT_DOUBLE_EQ(next_finish(model), 3.5);
  EXPECT_EQ(model.advance(3), ids{});  // not yet: half-way, 200 of 250 bytes moved
  EXPECT_NEAR(model.carried_bytes()[0], 200, 200 * kTolerance);
  EXPECT_EQ(model.advance(3.5), ids{1});
  EXPECT_EQ(model.active_flows(), 0u);
  EXPECT_FALSE(model.next_finish().has_value());
  EXPECT_NEAR(model.carried_bytes()[0], 250, 250 * kTolerance);
}

TEST(NetworkModelTest, PathRunsAtItsSlowestLink) {
  network_model model({100, 40, 1000});
  model.start(0, {0, 1, 2}, 200);
  EXPECT_DOUBLE_EQ(model.flow_rate(1), 40);
  EXPECT_DOUBLE_EQ(next_finish(model), 5);
  EXPECT_EQ(model.advance(5), ids{1});
}

TEST(NetworkModelTest, TwoFlowsOnOneLinkShareItEqually) {
  network_model model({100});
  model.start(0, {0}, 100);
  model.start(0, {0}, 100);
  EXPECT_DOUBLE_EQ(model.flow_rate(1), 50);
  EXPECT_DOUBLE_EQ(model.flow_rate(2), 50);
  EXPECT_DOUBLE_EQ(next_finish(model), 2);
  EXPECT_EQ(model.advance(2), (ids{1, 2}));
}

TEST(NetworkModelTest, FlowSpeedsUpWhenItsNeighbourFinishes) {
  network_model model({100});
  model.start(0, {0}, 100);  // A: 50 B/s until t=2
  model.start(0, {0}, 300);  // B: 100 bytes by t=2, then the 200 left at 100 B/s
  EXPECT_DOUBLE_EQ(next_finish(model), 2);
  EXPECT_EQ(model.advance(2), ids{1});
  EXPECT_DOUBLE_EQ(model.flow_rate(2), 100);
  EXPECT_DOUBLE_EQ(next_finish(model), 4);
  EXPECT_EQ(model.advance(4), ids{2});
}

// The textbook case: a long flow over three links, one or two short flows on each. Link 1 (two
// short flows) is the bottleneck: it splits three ways, 100/3 each; the short flow on link 0
// takes what the long flow leaves, 200/3, and the one on link 2 gets 300 - 100/3 = 800/3.
// Every flow carries three seconds' worth at its max-min rate, so all of them finish at t=3
// exactly when, and only when, every rate is right.
TEST(NetworkModelTest, ClassicMaxMinExample) {
  network_model model({100, 100, 300});
  const uint64_t long_flow = model.start(0, {0, 1, 2}, 100);
  const uint64_t short_0 = model.start(0, {0}, 200);
  const uint64_t short_1a = model.start(0, {1}, 100);
  const uint64_t short_1b = model.start(0, {1}, 100);
  const uint64_t short_2 = model.start(0, {2}, 800);
  EXPECT_NEAR(model.flow_rate(long_flow), 100.0 / 3, kTolerance);
  EXPECT_NEAR(model.flow_rate(short_0), 200.0 / 3, kTolerance);
  EXPECT_NEAR(model.flow_rate(short_1a), 100.0 / 3, kTolerance);
  EXPECT_NEAR(model.flow_rate(short_1b), 100.0 / 3, kTolerance);
  EXPECT_NEAR(model.flow_rate(short_2), 800.0 / 3, kTolerance);
  EXPECT_NEAR(next_finish(model), 3, 3 * kTolerance);
  EXPECT_EQ(model.advance(next_finish(model)), (ids{1, 2, 3, 4, 5}));
}

TEST(NetworkModelTest, FlowStartingMidFlightSharesFromThen) {
  network_model model({100});
  model.start(0, {0}, 300);  // alone until t=1: 200 bytes left
  EXPECT_DOUBLE_EQ(next_finish(model), 3);
  model.start(1, {0}, 100);  // both at 50 B/s: the newcomer finishes at t=3
  EXPECT_DOUBLE_EQ(next_finish(model), 3);
  EXPECT_EQ(model.advance(3), ids{2});
  EXPECT_DOUBLE_EQ(next_finish(model), 4);  // the first one's last 100 bytes at 100 B/s
  EXPECT_EQ(model.advance(4), ids{1});
}

TEST(NetworkModelTest, BandwidthFactorDelaysAndOneRestores) {
  network_model model({100, 1000});
  model.start(0, {0, 1}, 400);
  EXPECT_DOUBLE_EQ(next_finish(model), 4);
  model.set_bandwidth_factor(0, 0.5, 1);  // 300 bytes left at 50 B/s
  EXPECT_DOUBLE_EQ(next_finish(model), 7);
  model.set_bandwidth_factor(1, 0.01, 2);  // link 1 down to 10 B/s: now the bottleneck
  EXPECT_DOUBLE_EQ(next_finish(model), 2 + 250 / 10.0);
  model.set_bandwidth_factor(1, 1, 2);
  model.set_bandwidth_factor(0, 1, 3);  // 200 bytes left at 100 B/s again
  EXPECT_DOUBLE_EQ(next_finish(model), 5);
  EXPECT_EQ(model.advance(5), ids{1});
  EXPECT_EQ(model.bandwidths(), (std::vector<double>{100, 1000}));  // nominal, unchanged
}

TEST(NetworkModelTest, FactorOnAnIdleLinkAppliesToLaterFlows) {
  network_model model({100});
  model.set_bandwidth_factor(0, 0.25, 0);
  model.start(1, {0}, 100);
  EXPECT_DOUBLE_EQ(next_finish(model), 5);
}

TEST(NetworkModelTest, CarriedBytesCountEveryLinkCrossed) {
  network_model model({100, 200, 300, 400});
  model.start(0, {0, 1, 2}, 1000);
  model.start(0.5, {2, 3}, 700);
  while (const std::optional<double> next = model.next_finish()) model.advance(*next);
  const std::vector<double> expected = {1000, 1000, 1700, 700};
  double total = 0;
  for (size_t link = 0; link < expected.size(); ++link) {
    EXPECT_NEAR(model.carried_bytes()[link], expected[link], expected[link] * kTolerance);
    total += model.carried_bytes()[link];
  }
  EXPECT_NEAR(total, 1000 * 3 + 700 * 2, 4400 * kTolerance);
}

// Flow 2 finishing first leaves the others in a different order in any store that moves the
// last element into a hole; the three that finish together must still come back in id order.
TEST(NetworkModelTest, SimultaneousFinishesComeBackInIdOrder) {
  network_model model({100, 100, 100, 100});
  for (int link = 0; link < 4; ++link) model.start(0, {link}, link == 1 ? 100 : 200);
  EXPECT_EQ(model.advance(1), ids{2});
  EXPECT_EQ(model.advance(2), (ids{1, 3, 4}));
  model.start(2, {3}, 100);  // ids keep growing after finishes
  model.start(2, {0}, 100);
  EXPECT_EQ(model.advance(3), (ids{5, 6}));
}

// Late in a long run a finish time is rounded to the clock's resolution, which at a 100 GB/s
// link leaves a fraction of a byte either way; advancing to next_finish() must still end it.
TEST(NetworkModelTest, AdvancingToNextFinishAlwaysFinishesAFlow) {
  network_model model({1e11, 3e10});
  double now = 1e6;
  for (int flow = 0; flow < 1000; ++flow) {
    model.start(now, {flow % 2, 1 - flow % 2}, 1000 + 7.3 * flow);
    if (flow % 3 == 0) model.start(now, {1}, 500 + 3.1 * flow);
    while (model.active_flows() > 0) {
      now = next_finish(model);
      ASSERT_FALSE(model.advance(now).empty()) << "flow " << flow << " at " << now;
    }
  }
}

TEST(NetworkModelTest, TimeGoingBackwardsAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  network_model model({100});
  model.start(1, {0}, 100);
  EXPECT_DEATH(model.advance(0.5), "check failed");
  EXPECT_DEATH(model.start(0.5, {0}, 100), "check failed");
}

/// One randomized run's record: every flow's path and size, and each finish (time, id).
struct random_run {
  std::map<uint64_t, std::pair<std::vector<int>, double>> flows;
  std::vector<std::pair<double, uint64_t>> finishes;
  std::vector<double> carried;
};

/// Checks the max-min conditions on the current rates: no link is over its bandwidth, and
/// every flow has a bottleneck, a saturated link on which no flow is faster than it.
void expect_max_min_fair(const network_model& model, const random_run& run,
                         const std::vector<double>& capacity, const std::vector<uint64_t>& active) {
  std::vector<double> load(capacity.size(), 0), fastest(capacity.size(), 0);
  for (uint64_t id : active) {
    const double rate = model.flow_rate(id);
    ASSERT_GT(rate, 0) << "flow " << id;
    for (int link : run.flows.at(id).first) {
      load[link] += rate;
      fastest[link] = std::max(fastest[link], rate);
    }
  }
  for (size_t link = 0; link < capacity.size(); ++link) {
    EXPECT_LE(load[link], capacity[link] * (1 + kTolerance)) << "link " << link;
  }
  for (uint64_t id : active) {
    const double rate = model.flow_rate(id);
    bool bottlenecked = false;
    for (int link : run.flows.at(id).first) {
      bottlenecked |= load[link] >= capacity[link] * (1 - kTolerance) &&
                      rate >= fastest[link] * (1 - kTolerance);
    }
    EXPECT_TRUE(bottlenecked) << "flow " << id << " at " << rate << " B/s has no bottleneck";
  }
}

/// A few hundred flows over six links with random paths, sizes, start times and link
/// degradations, checking fairness after every call.
random_run run_randomly(uint32_t seed) {
  std::mt19937 random(seed);
  const std::vector<double> bandwidths = {100, 250, 400, 50, 1000, 300};
  std::vector<double> capacity = bandwidths;
  network_model model(bandwidths);
  random_run run;
  std::vector<uint64_t> active;
  std::uniform_real_distribution<double> unit(0, 1);
  double now = 0;
  while (run.flows.size() < 300 || !active.empty()) {
    const double candidate = now + 2 * unit(random);
    const std::optional<double> next = model.next_finish();
    if (next && (*next <= candidate || run.flows.size() >= 300)) {
      EXPECT_GE(*next, now);
      now = *next;
      const std::vector<uint64_t> finished = model.advance(now);
      EXPECT_FALSE(finished.empty()) << "advancing to next_finish() finished nothing";
      EXPECT_TRUE(std::is_sorted(finished.begin(), finished.end()));
      for (uint64_t id : finished) {
        auto found = std::find(active.begin(), active.end(), id);
        EXPECT_NE(found, active.end()) << "flow " << id << " finished twice or never started";
        if (found != active.end()) active.erase(found);
        run.finishes.emplace_back(now, id);
      }
    } else if (unit(random) < 0.85) {
      now = candidate;
      std::vector<int> path = {0, 1, 2, 3, 4, 5};
      std::shuffle(path.begin(), path.end(), random);
      path.resize(1 + random() % 3);
      const double bytes = 1 + 999 * unit(random);
      const uint64_t id = model.start(now, path, bytes);
      EXPECT_EQ(id, run.flows.size() + 1);
      run.flows[id] = {path, bytes};
      active.push_back(id);
    } else {
      now = candidate;
      const int link = static_cast<int>(random() % bandwidths.size());
      const double factor = std::vector<double>{0.2, 0.5, 1, 1, 1.5}[random() % 5];
      model.set_bandwidth_factor(link, factor, now);
      capacity[link] = bandwidths[link] * factor;
    }
    EXPECT_EQ(model.active_flows(), active.size());
    expect_max_min_fair(model, run, capacity, active);
    if (testing::Test::HasFailure()) break;  // one broken state, not thousands of messages
  }
  run.carried = model.carried_bytes();
  return run;
}

TEST(NetworkModelTest, RandomFlowsConserveBytesAndStayFair) {
  const random_run run = run_randomly(20240607);
  ASSERT_FALSE(testing::Test::HasFailure());
  EXPECT_EQ(run.finishes.size(), run.flows.size());
  std::vector<double> expected(run.carried.size(), 0);
  for (const auto& [id, flow] : run.flows) {
    for (int link : flow.first) expected[link] += flow.second;
  }
  for (size_t link = 0; link < expected.size(); ++link) {
    EXPECT_GT(expected[link], 0);
    EXPECT_NEAR(run.carried[link], expected[link], expected[link] * kTolerance) << link;
  }
}

TEST(NetworkModelTest, SameCallsGiveBitIdenticalFinishes) {
  const random_run first = run_randomly(7);
  const random_run second = run_randomly(7);
  ASSERT_FALSE(first.finishes.empty());
  EXPECT_EQ(first.finishes, second.finishes);
  EXPECT_EQ(first.carried, second.carried);
  EXPECT_NE(first.finishes, run_randomly(8).finishes);
}

/// start() and advance() calls per second with `flows` flows always in flight, each finish
/// replaced by a new flow over path(random); prints the rate, returns the flows finished.
template <typename path_maker>
int64_t measure_operations(const char* name, std::vector<double> bandwidths, int flows,
                           path_maker make_path) {
  std::mt19937 random(64);
  network_model model(std::move(bandwidths));
  std::vector<int> path;
  auto start_one = [&](double now) {
    make_path(random, path);
    model.start(now, path, 1e6 * (1 + random() % 100));
  };
  for (int flow = 0; flow < flows; ++flow) start_one(0);
  constexpr int64_t kOperations = 100000;
  int64_t operations = 0, finished = 0;
  const auto began = std::chrono::steady_clock::now();
  while (operations < kOperations) {
    const double now = *model.next_finish();
    const std::vector<uint64_t> done = model.advance(now);
    ++operations;
    finished += static_cast<int64_t>(done.size());
    for (size_t i = 0; i < done.size(); ++i, ++operations) start_one(now);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  std::printf("network_model, %d flows, %s: %.0f start/advance calls per second\n", flows, name,
              static_cast<double>(operations) / seconds);
  EXPECT_EQ(model.active_flows(), static_cast<size_t>(flows));
  return finished;
}

// Not a timed assertion: prints the call rate with 64 flows in flight over 200 links, on
// random paths of 2 to 4 links (nearly all flows end up connected, so every change
// recomputes most rates) and on a pipeline's paths (64 stages on 16 nodes of 4 devices,
// each flow to a neighbouring stage: device egress, NICs across nodes, device ingress).
TEST(NetworkModelTest, ReportsOperationsPerSecondWithSixtyFourFlows) {
  std::vector<double> bandwidths(200, 1.25e10);                    // NICs
  for (int link = 0; link < 128; ++link) bandwidths[link] = 3e11;  // device ports
  const int64_t random_finished =
      measure_operations("random paths", bandwidths, 64, [](std::mt19937& random, auto& path) {
        path.assign(2 + random() % 3, 0);
        for (int& link : path) link = static_cast<int>(random() % 200);
      });
  EXPECT_GT(random_finished, 100000 / 3);
  const int64_t pipeline_finished =
      measure_operations("pipeline paths", bandwidths, 64, [](std::mt19937& random, auto& path) {
        const int from = static_cast<int>(random() % 64);
        const int to = from == 63 || (from > 0 && random() % 2 == 0) ? from - 1 : from + 1;
        path = {2 * from};
        if (from / 4 != to / 4) path.insert(path.end(), {128 + 2 * (from / 4), 129 + 2 * (to / 4)});
        path.push_back(2 * to + 1);
      });
  EXPECT_GT(pipeline_finished, 100000 / 3);
}

}  // namespace
}  // namespace troupe::sim
