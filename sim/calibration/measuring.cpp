#include "sim/calibration/measuring.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "actors/engine/training_run.h"
#include "actors/hosts/wire_format.h"

namespace troupe::sim {

actors::stage_settings engine_settings(const actors::job_config& config) {
  return actors::stage_settings_of(config, 0, 1, 1, {}, 0);
}

int keys_in_round(const actors::job_config& config) {
  if (config.parallelism.mode == actors::pipeline_mode::sync) {
    return std::max(1, config.parallelism.micro_batches);
  }
  return std::max(1, config.parallelism.min_update_interval);
}

std::vector<int> balanced_groups(const std::vector<double>& costs, int groups) {
  std::vector<size_t> order(costs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return costs[a] > costs[b]; });
  std::vector<double> totals(static_cast<size_t>(std::max(1, groups)), 0.0);
  std::vector<int> members(totals.size(), 0);
  std::vector<int> group_of(costs.size(), 0);
  for (size_t item : order) {
    size_t least = 0;
    for (size_t g = 1; g < totals.size(); ++g) {
      // An empty group first, so that every group gets an item (costs may be 0).
      const bool emptier = (members[g] == 0) != (members[least] == 0);
      if (emptier ? members[g] == 0 : totals[g] < totals[least]) least = g;
    }
    group_of[item] = static_cast<int>(least);
    totals[least] += costs[item];
    ++members[least];
  }
  return group_of;
}

bool round_barrier::arrive_and_wait(bool enough) {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t generation = generation_;
  enough_ += enough ? 1 : 0;
  if (++arrived_ == groups_) {
    last_answer_ = enough_ == groups_;
    arrived_ = 0;
    enough_ = 0;
    ++generation_;
    all_arrived_.notify_all();
    return last_answer_;
  }
  all_arrived_.wait(lock, [&] { return generation_ != generation; });
  return last_answer_;
}

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

double log_spread(const std::vector<const std::vector<double>*>& groups) {
  std::vector<double> logs;
  for (const std::vector<double>* times : groups) {
    if (times->size() < 4) continue;
    const double middle = median(*times);
    if (middle <= 0) continue;
    for (double time : *times) {
      if (time > 0) logs.push_back(std::log(time / middle));
    }
  }
  if (logs.size() < 4) return 0;
  std::sort(logs.begin(), logs.end());
  const double interquartile = logs[logs.size() * 3 / 4] - logs[logs.size() / 4];
  return interquartile / 1.349;
}

double cpu_seconds(clockid_t clock) {
  timespec now{};
  clock_gettime(clock, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

transport::message filled_message(transport::message_kind kind, size_t bytes) {
  transport::message message;
  message.header.kind = kind;
  const size_t floats = std::max<size_t>(1, bytes / sizeof(float));
  transport::add_payload(message, {static_cast<int64_t>(floats)},
                         std::make_shared<const std::vector<float>>(floats, 1.0f));
  return message;
}

layers::tensor batched(layers::backend& device, const layers::shape& sample, int64_t batch) {
  layers::shape dims{batch};
  dims.insert(dims.end(), sample.begin(), sample.end());
  std::vector<float> values(static_cast<size_t>(layers::element_count(dims)), 0.5f);
  return layers::tensor::from_host(device, device.default_stream(), dims, values);
}

actors::key_message sample_key(layers::backend& device, const layers::shape& shape,
                               int64_t samples) {
  actors::key_message key;
  key.kind = actors::key_kind::forward;
  key.payload = batched(device, shape, samples);
  key.labels = std::make_shared<const std::vector<int32_t>>(static_cast<size_t>(samples), 0);
  return key;
}

namespace {

/// What a receiving end does with each message: counts the keys that decode and wakes the
/// sender, which waits for each before it sends the next.
struct arrivals {
  std::mutex mutex;
  std::condition_variable arrived;
  int received = 0;

  void add(bool decoded) {
    std::lock_guard<std::mutex> lock(mutex);
    received += decoded ? 1 : 0;
    arrived.notify_one();
  }
  bool wait_for(int count) {
    std::unique_lock<std::mutex> lock(mutex);
    return arrived.wait_for(lock, std::chrono::seconds(10), [&] { return received >= count; });
  }
};

/// Sends `rounds` keys on `out`, each after the previous one arrived; `told` runs after each
/// send. The process's CPU seconds per message, halved, or -1 when one went missing.
template <class told_type>
double cpu_per_end(transport::outbox& out, actors::key_message& key, arrivals& ends, int rounds,
                   told_type told, double* latency_s) {
  const actors::wire_route route{1, 0, 1, 0, 0.0};
  const double start = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  std::vector<double> latencies;
  for (int r = 0; r < rounds; ++r) {
    const auto begin = clock_type::now();
    key.key = static_cast<uint64_t>(r);
    if (!out.send_waiting(actors::to_wire(key, route), std::chrono::seconds(10)).ok()) return -1;
    told();
    if (!ends.wait_for(r + 1)) return -1;
    latencies.push_back(seconds_since(begin));
  }
  *latency_s = median(latencies);
  return (cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - start) / rounds / 2;
}

}  // namespace

double message_cpu_seconds(transport::transport_context& context,
                           transport::transport_context& sending_context,
                           const std::string& address, layers::backend& device,
                           const layers::shape& shape, int64_t samples, int rounds,
                           double* latency_s) {
  transport::endpoint_error problem;
  auto in = transport::inbox::bind(context, address, {}, &problem);
  auto out = in ? transport::outbox::connect(sending_context, address, {}, &problem) : std::nullopt;
  if (!in || !out) return -1;
  arrivals ends;
  std::vector<transport::inbox> inboxes;
  inboxes.push_back(std::move(*in));
  transport::receiver_thread receiver(
      context, std::move(inboxes), [&](transport::message&& incoming) {
        std::string ignored;
        ends.add(actors::key_from_wire(incoming, device, &ignored).has_value());
      });
  actors::key_message key = sample_key(device, shape, samples);
  return cpu_per_end(
      *out, key, ends, rounds, [] {}, latency_s);
}

double taken_message_cpu_seconds(transport::transport_context& context, const std::string& address,
                                 layers::backend& device, const layers::shape& shape,
                                 int64_t samples, int rounds, double* latency_s) {
  transport::endpoint_error problem;
  auto in = transport::inbox::bind(context, address, {}, &problem);
  auto out = in ? transport::outbox::connect(context, address, {}, &problem) : std::nullopt;
  if (!in || !out) return -1;
  arrivals ends;
  // The reader's mailbox: how many messages it was told of, and whether to stop.
  std::mutex mutex;
  std::condition_variable told;
  int announced = 0;
  bool stop = false;
  std::thread reader([&] {
    for (int taken = 0;; ++taken) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        told.wait(lock, [&] { return stop || announced > taken; });
        if (stop) return;
      }
      auto received = in->try_receive();
      std::string ignored;
      ends.add(received && received->ok() &&
               actors::key_from_wire(*received->value, device, &ignored).has_value());
    }
  });
  actors::key_message key = sample_key(device, shape, samples);
  const double cpu = cpu_per_end(
      *out, key, ends, rounds,
      [&] {
        std::lock_guard<std::mutex> lock(mutex);
        ++announced;
        told.notify_one();
      },
      latency_s);
  {
    std::lock_guard<std::mutex> lock(mutex);
    stop = true;
    told.notify_one();
  }
  reader.join();
  return cpu;
}

double coordinator_seconds_per_sample(const layers::dataset& train, int64_t batch,
                                      layers::backend& host, double seconds) {
  const int64_t count = train.count();
  if (count <= 0 || batch <= 0) return 0;
  // A fixed sequence of indices spread over the whole set, as a shuffled epoch's are: each
  // key's rows come from memory the last keys did not touch.
  uint64_t state = 0x9e3779b97f4a7c15ull;
  std::vector<int64_t> samples(static_cast<size_t>(batch));
  std::vector<double> times;
  const auto start = clock_type::now();
  for (uint64_t key = 0; times.size() < 5 || seconds_since(start) < seconds; ++key) {
    for (int64_t& sample : samples) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      sample = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(count));
    }
    const auto begin = clock_type::now();
    const actors::key_message message =
        actors::batch_message(actors::key_kind::forward, key, samples, train, host);
    const transport::message wire = actors::to_wire(message, actors::wire_route{});
    times.push_back(seconds_since(begin));
    if (wire.payloads.empty()) return 0;
  }
  return median(times) / static_cast<double>(batch);
}

}  // namespace troupe::sim
