// The simulator's model of a process whose stage actors outnumber its cores: they take turns on
// the scheduler's threads with the coordinator, each keeps its thread while it has mail, and
// the passes' durations spread as a shared CPU's do (device_model::work_jitter); a replica's
// ring chunks go before a stage's other mail.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/calibration/calibrate.h"
#include "sim/calibration/measuring.h"
#include "sim/profile.h"
#include "tests/sim/simulation_fixtures.h"

namespace troupe::sim {
namespace {

struct traced_span {
  int track = 0;  ///< 0: the coordinator; s + 1: stage s
  std::string name;
  double start_us = 0, end_us = 0;
};

/// The work spans (not the idle gaps) and message arrivals of `result`'s trace, by track.
struct trace_contents {
  std::map<int, std::vector<traced_span>> spans;
  std::map<int, std::vector<double>> arrivals_us;
};

trace_contents read_trace(const simulation_result& result) {
  trace_contents contents;
  const nlohmann::json timeline = result.trace->to_json();
  for (const auto& event : timeline["traceEvents"]) {
    const int track = event["tid"].get<int>();
    if (event["ph"] == "X" && event["name"] != "idle") {
      const double start = event["ts"].get<double>();
      contents.spans[track].push_back(
          {track, event["name"].get<std::string>(), start, start + event["dur"].get<double>()});
    } else if (event["ph"] == "f") {
      contents.arrivals_us[track].push_back(event["ts"].get<double>());
    }
  }
  for (auto& [track, spans] : contents.spans) {
    std::sort(spans.begin(), spans.end(), [](const traced_span& a, const traced_span& b) {
      return a.start_us < b.start_us || (a.start_us == b.start_us && a.end_us < b.end_us);
    });
  }
  for (auto& [track, arrivals] : contents.arrivals_us) std::sort(arrivals.begin(), arrivals.end());
  return contents;
}

/// A pool of `devices` cores on node 0, where the coordinator lives, with `more` in its type.
cluster_model core_pool(int devices, const std::string& more = "") {
  const std::string text = "[device_types.core]\nkind = \"cpu\"\npooled = true\n" + more +
                           "peak_flops = 1e11\nmemory_bandwidth = 1e18\nmemory_bytes = 1e12\n"
                           "[[nodes]]\nname = \"node\"\ndevice_type = \"core\"\ndevices = " +
                           std::to_string(devices) +
                           "\ndevice_link = { bandwidth = 1e18 }\nnic = { bandwidth = 1e18 }\n";
  std::string error;
  auto cluster = parse_cluster(text, "core pool", &error);
  EXPECT_TRUE(cluster) << error;
  return *cluster;
}

/// Two async replicas of one stage, two keys in flight each, averaging their weights every step.
actors::job_config averaging_replicas() {
  actors::job_config config = balanced_job(4, 1, actors::pipeline_mode::async);
  config.parallelism.stages = 1;
  config.parallelism.replicas = 2;
  config.parallelism.max_active_keys = 2;
  config.parallelism.min_update_interval = 1;
  config.parallelism.replica_sync_interval = 1;
  return config;
}

/// An asynchronous 4-stage job whose coordinator spends `per_sample_s` on each sample it admits.
simulation_options traced_with_coordinator_cost(double per_sample_s) {
  simulation_options options;
  options.trace_spans = 100000;
  options.profile = machine_profile{};
  options.profile->batch = 32;
  // A layernorm and four linear blocks (balanced_job(4, ...)): 1 ms forward, 2 ms backward.
  for (int b = 0; b < 5; ++b) {
    block_profile block;
    block.type = b == 0 ? "layernorm" : "linear";
    block.forward_s = b == 0 ? 1e-5 : 1e-3;
    block.backward_s = b == 0 ? 1e-5 : 2e-3;
    block.backward_first_s = block.backward_s;
    options.profile->blocks.push_back(block);
  }
  options.profile->coordinator_s_per_sample = per_sample_s;
  return options;
}

actors::job_config four_async_stages() {
  actors::job_config config = balanced_job(4, 1, actors::pipeline_mode::async);
  config.parallelism.max_active_keys = 4;
  config.parallelism.min_update_interval = 1;
  return config;
}

/// The most spans of any tracks, the coordinator's included, that overlap at one instant.
int most_at_once(const trace_contents& contents) {
  std::vector<std::pair<double, int>> edges;
  for (const auto& [track, spans] : contents.spans) {
    for (const traced_span& span : spans) {
      if (span.end_us - span.start_us < 0.02) continue;  // a zero-cost report
      edges.push_back({span.start_us + 0.01, 1});
      edges.push_back({span.end_us - 0.01, -1});
    }
  }
  std::sort(edges.begin(), edges.end());
  int now = 0, most = 0;
  for (const auto& [time, change] : edges) most = std::max(most, now += change);
  return most;
}

TEST(SharedSchedulerTest, TheCoordinatorTakesTurnsWithTheStagesThatOutnumberTheCores) {
  const actors::job_config config = four_async_stages();
  // 2 ms of admission per key of 32 samples: as long as a stage's forward.
  const simulation_options options = traced_with_coordinator_cost(2e-3 / 32);
  const simulation_result shared = simulated(config, core_pool(2), options);
  const trace_contents contents = read_trace(shared);
  ASSERT_TRUE(contents.spans.count(0)) << "no coordinator spans";
  double admitting_us = 0;
  for (const traced_span& span : contents.spans.at(0)) {
    if (span.name == "admit") admitting_us += span.end_us - span.start_us;
  }
  // Every admitted key's batch was charged to the pool, at 2 ms a key.
  const double keys = static_cast<double>(shared.summary.steps);
  EXPECT_GT(admitting_us, keys * 2000 * 0.9);
  // Two cores: never more than two of the five actors at work at once.
  EXPECT_EQ(most_at_once(contents), 2);

  // With a core per stage, the stages' actors have threads of their own and the coordinator's
  // is apart from them: its admissions take no stage's core.
  const simulation_result apart = simulated(config, core_pool(4), options);
  EXPECT_FALSE(read_trace(apart).spans.count(0));
}

TEST(SharedSchedulerTest, AStageKeepsItsCoreWhileItHasMail) {
  const actors::job_config config = four_async_stages();
  const simulation_result result =
      simulated(config, core_pool(2), traced_with_coordinator_cost(1e-5));
  const trace_contents contents = read_trace(result);
  int checked = 0;
  for (const auto& [track, spans] : contents.spans) {
    const std::vector<double>& arrivals = contents.arrivals_us.at(track);
    for (size_t i = 0; i + 1 < spans.size(); ++i) {
      // Messages that had arrived well before this span ended, against those taken so far.
      const auto arrived =
          std::lower_bound(arrivals.begin(), arrivals.end(), spans[i].end_us - 0.01) -
          arrivals.begin();
      if (static_cast<size_t>(arrived) <= i + 1) continue;
      ++checked;
      EXPECT_NEAR(spans[i + 1].start_us, spans[i].end_us, 0.01)
          << "track " << track << " left mail waiting after its span " << i;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(SharedSchedulerTest, PassesSpreadByTheDevicesJitterAndTheSeedReplaysThem) {
  actors::job_config config = four_async_stages();
  config.training.epochs = 4;
  simulation_options options = traced_with_coordinator_cost(0);
  const auto forward_spans = [&](const cluster_model& cluster) {
    std::vector<double> durations;
    // The trace held in a variable: a range-for over a member of a temporary would outlive it.
    const trace_contents contents = read_trace(simulated(config, cluster, options));
    for (const traced_span& span : contents.spans.at(2)) {
      if (span.name == "forward") durations.push_back(span.end_us - span.start_us);
    }
    return durations;
  };
  const std::vector<double> steady = forward_spans(core_pool(4));
  ASSERT_GT(steady.size(), 100u);
  EXPECT_NEAR(*std::max_element(steady.begin(), steady.end()),
              *std::min_element(steady.begin(), steady.end()), 1e-6);
  const std::vector<double> spread = forward_spans(core_pool(4, "work_jitter = 0.2\n"));
  ASSERT_EQ(spread.size(), steady.size());
  double sum = 0, sum_logs = 0, sum_squares = 0;
  for (double duration : spread) {
    sum += duration;
    const double log_ratio = std::log(duration / steady.front());
    sum_logs += log_ratio;
    sum_squares += log_ratio * log_ratio;
  }
  const double n = static_cast<double>(spread.size());
  const double deviation = std::sqrt(sum_squares / n - (sum_logs / n) * (sum_logs / n));
  EXPECT_NEAR(deviation, 0.2, 0.03);
  // The spread keeps the mean, which calibration measured.
  EXPECT_NEAR(sum / n / steady.front(), 1.0, 0.04);

  const cluster_model jittery = core_pool(2, "work_jitter = 0.1\n");
  options.trace_spans = 0;
  options.seed = 3;
  const uint64_t first = simulated(config, jittery, options).trace_hash;
  EXPECT_EQ(simulated(config, jittery, options).trace_hash, first);
  options.seed = 4;
  EXPECT_NE(simulated(config, jittery, options).trace_hash, first);
}

TEST(SharedSchedulerTest, WorkJitterIsReadCheckedAndMeasured) {
  std::string error;
  EXPECT_FALSE(parse_cluster(
      "[device_types.core]\nkind = \"cpu\"\npeak_flops = 1e11\nmemory_bandwidth = 1e9\n"
      "memory_bytes = 1e9\nwork_jitter = 1.5\n[[nodes]]\nname = \"n\"\ndevice_type = \"core\"\n",
      "c.toml", &error));
  EXPECT_NE(error.find("device_types.core.work_jitter"), std::string::npos) << error;
  EXPECT_NE(error.find("in [0, 1]"), std::string::npos) << error;

  // log(t / median) of {e^-1, 1, 1, e}: -1, 0, 0, 1; quartiles 0 and 1.
  const std::vector<double> times = {std::exp(-1.0), 1.0, 1.0, std::exp(1.0)};
  const std::vector<double> few = {1.0, 5.0};
  EXPECT_NEAR(log_spread({&times, &few}), 1 / 1.349, 1e-12);
  EXPECT_EQ(log_spread({&few}), 0);

  actors::job_config config = balanced_job(2, 1, actors::pipeline_mode::async);
  config.data.synthetic_train = 320;
  auto measured = calibrate(config, 0.01, &error);
  ASSERT_TRUE(measured) << error;
  EXPECT_GT(measured->work_jitter, 0);
  EXPECT_LE(measured->work_jitter, 1);
  auto reread = parse_profile(to_json_text(*measured), "profile", &error);
  ASSERT_TRUE(reread) << error;
  EXPECT_EQ(reread->work_jitter, measured->work_jitter);
  std::string text = to_json_text(*measured);
  const size_t at = text.find("\"work_jitter\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, text.find_first_of(",\n}", text.find(':', at)) - at, "\"work_jitter\": 2");
  EXPECT_FALSE(parse_profile(text, "p.json", &error));
  EXPECT_NE(error.find("p.json: work_jitter: must be <= 1"), std::string::npos) << error;

  // A cluster's own spread stays; devices without one take the profile's.
  cluster_model cluster = core_pool(2, "work_jitter = 0.3\n");
  use_measured_transport(*measured, &cluster, true);
  EXPECT_EQ(cluster.devices.front().work_jitter, 0.3);
  cluster = core_pool(2);
  use_measured_transport(*measured, &cluster, true);
  EXPECT_EQ(cluster.devices.front().work_jitter, measured->work_jitter);
}

TEST(SharedSchedulerTest, OnFewerPooledDevicesThanStagesOneFOneBPassesGpipeWithManyMicroBatches) {
  // Four stages shaped like the Fashion-MNIST MLP's share a pool of two devices, as `troupe
  // train` runs them on a machine of two cores: a light first stage (its linear block computes
  // no input gradient), two heavy ones and an almost empty last one (256 -> 8). A device idles
  // only while fewer than two stages have work. GPipe turns every step around in its middle,
  // where the heavy stages wait on each other's first and last passes; 1F1B, once its
  // micro-batches outnumber the stages, interleaves forwards and backwards without that turn.
  // With as many micro-batches as stages it only removes choices (measured on this machine:
  // 1F1B 0.96x GPipe at m = 4, 1.07x at m = 16; README, Results).
  auto rate = [](int micro_batches, actors::pipeline_schedule schedule) {
    actors::job_config config = balanced_job(4, micro_batches, actors::pipeline_mode::sync);
    config.model.layers.erase(config.model.layers.begin());  // no layernorm before stage 0
    config.model.layers.back().out = 8;
    config.data.classes = 8;
    config.parallelism.schedule = schedule;
    return simulated(config, ideal_cluster(2, sharing::pooled)).summary.samples_per_s;
  };
  for (int micro_batches : {4, 16}) {
    const double gpipe = rate(micro_batches, actors::pipeline_schedule::gpipe);
    const double one_f_one_b = rate(micro_batches, actors::pipeline_schedule::one_f_one_b);
    const double zero_bubble = rate(micro_batches, actors::pipeline_schedule::zb_h1);
    std::printf(
        "4 stages on 2 pooled devices, m=%-2d samples/s: gpipe %.0f, 1f1b %.0f (%.3fx), "
        "zb-h1 %.0f (%.3fx)\n",
        micro_batches, gpipe, one_f_one_b, one_f_one_b / gpipe, zero_bubble, zero_bubble / gpipe);
    if (micro_batches > 4) {
      EXPECT_GT(one_f_one_b, 1.03 * gpipe) << "m=" << micro_batches;
    }
    EXPECT_GE(zero_bubble, one_f_one_b) << "m=" << micro_batches;
    EXPECT_GE(zero_bubble, gpipe) << "m=" << micro_batches;
  }
}

TEST(SharedSchedulerTest, AStageTakesARingChunkBeforeItsOtherMail) {
  // Two replicas of one stage averaging their weights every step, on one core: a chunk of the
  // ring and the coordinator's next key often wait for a stage together.
  actors::job_config config = averaging_replicas();
  simulation_options options = traced_with_coordinator_cost(1e-5);
  options.profile->parameter_copy_s_per_float = 1e-9;  // a chunk's handling takes time
  const simulation_result result = simulated(config, core_pool(1), options);
  const nlohmann::json records = result.trace->records();
  int checked = 0;
  for (int stage = 0; stage < 2; ++stage) {
    // When the stage began each piece of work, the chunks that had reached it and the chunks it
    // had taken: it never began other work while a chunk waited.
    std::vector<double> chunk_arrivals, chunk_starts, other_starts;
    for (const auto& flow : records["flows"]) {
      if (flow[0] == 1 - stage && flow[1] == stage) chunk_arrivals.push_back(flow[4]);
    }
    for (const auto& span : records["spans"]) {
      if (span[0] != stage) continue;
      (span[1] == "reduce" ? chunk_starts : other_starts).push_back(span[3]);
    }
    ASSERT_FALSE(chunk_arrivals.empty());
    std::sort(chunk_arrivals.begin(), chunk_arrivals.end());
    std::sort(chunk_starts.begin(), chunk_starts.end());
    for (double start : other_starts) {
      const auto arrived = std::lower_bound(chunk_arrivals.begin(), chunk_arrivals.end(), start) -
                           chunk_arrivals.begin();
      // A chunk that waits for the stage's own round takes no time: it may start at `start`.
      const auto taken =
          std::upper_bound(chunk_starts.begin(), chunk_starts.end(), start) - chunk_starts.begin();
      EXPECT_LE(arrived, taken) << "stage " << stage << " at " << start << " s";
      checked += arrived > 0;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(SharedSchedulerTest, ReplicaGroupsSumWithoutTheRingsMessageCosts) {
  // Two sync replicas of one stage on two cores: the ring's pieces are messages, each end paying
  // 50 us and a link's latency; a shared-memory group sums in memory, an NCCL group on the links.
  actors::job_config config = balanced_job(4, 1, actors::pipeline_mode::sync);
  config.parallelism.stages = 1;
  config.parallelism.replicas = 2;
  simulation_options options = traced_with_coordinator_cost(0);
  options.message_cpu_s = 5e-5;
  std::map<std::string, double> seconds;
  for (actors::collective_kind collective :
       {actors::collective_kind::ring, actors::collective_kind::shared_memory,
        actors::collective_kind::nccl}) {
    config.parallelism.collective = collective;
    const simulation_result result = simulated(config, core_pool(2), options);
    seconds[to_string(collective)] = result.virtual_s;
    int reduces = 0;
    const nlohmann::json records = result.trace->records();
    for (const auto& span : records["spans"]) reduces += span[1] == "reduce" ? 1 : 0;
    EXPECT_GT(reduces, 0) << to_string(collective) << ": the sum still takes its adds and copies";
  }
  EXPECT_LT(seconds["shared_memory"], seconds["ring"]);
  EXPECT_LT(seconds["nccl"], seconds["ring"]);
}

TEST(SharedSchedulerTest, AsyncReplicaGroupsAverageInLockStep) {
  // Two async replicas of one stage, one on a device three times slower, averaging every step:
  // the ring lets the faster replica train on while its average waits for the slower one; a
  // group (shared memory, NCCL) holds it in the collective until both have come.
  actors::job_config config = averaging_replicas();
  simulation_options options = traced_with_coordinator_cost(0);
  options.profile->parameter_copy_s_per_float = 1e-9;
  options.stragglers = {{1, 1.0, 3.0}};
  for (actors::collective_kind collective :
       {actors::collective_kind::ring, actors::collective_kind::shared_memory}) {
    config.parallelism.collective = collective;
    const simulation_result result = simulated(config, core_pool(2), options);
    // The faster replica's work in order: 'T' a training pass, 'R' a piece of an average.
    const nlohmann::json records = result.trace->records();
    std::vector<std::pair<double, char>> spans;
    for (const auto& span : records["spans"]) {
      if (span[0].get<int>() != 0 || span[1] == "evaluate") continue;
      spans.push_back({span[3].get<double>(), span[1] == "reduce" ? 'R' : 'T'});
    }
    std::sort(spans.begin(), spans.end());
    std::string order;
    for (const auto& [start, kind] : spans) order += kind;
    ASSERT_GT(order.size(), 20u) << to_string(collective);
    // Two training passes in a row: a step taken while the average before it was under way.
    const bool trained_on = order.find("TT") != std::string::npos;
    EXPECT_EQ(trained_on, collective == actors::collective_kind::ring)
        << to_string(collective) << ": " << order;
  }
}

}  // namespace
}  // namespace troupe::sim
