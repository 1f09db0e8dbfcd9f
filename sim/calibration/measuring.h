#pragma once

// Small tools that calibration's measurements share.

#include <time.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/pipeline_messages.h"
#include "actors/engine/stage_settings.h"
#include "layers/backend.h"
#include "layers/dataset.h"
#include "layers/tensor.h"
#include "transport/endpoint.h"
#include "transport/message.h"

namespace troupe::sim {

using clock_type = std::chrono::steady_clock;

/// How far a timed predicted stash (staleness_correction = "predict") moves the weights along
/// the momentum: any distance costs the same.
constexpr float predicted_distance = 0.01f;

/// The engine's settings of a stage of `config`: whether it stashes or predicts weights.
actors::stage_settings engine_settings(const actors::job_config& config);

/// Keys of one timed training round: the keys a stage handles between two steps, as in the
/// engine (a sync stage steps after all its micro-batches, an async one every
/// min_update_interval keys).
int keys_in_round(const actors::job_config& config);

/// Which of `groups` groups each of the items of `costs` joins so that the groups' total costs
/// come out even: the most costly item first, each to the group with the least so far (the
/// first of those on a tie). Every group gets an item while there are enough.
std::vector<int> balanced_groups(const std::vector<double>& costs, int groups);

/// Groups that time rounds side by side meet here after each round, as a pipeline's stages each
/// handle every key once and the slowest sets the pace: a group that finished its round early
/// waits for the others, idle, as its stages would in training, instead of running more rounds
/// than they do beside them. A group says whether it has timed enough; all stop together once
/// every group has.
class round_barrier {
 public:
  explicit round_barrier(int groups) : groups_(groups) {}

  /// Waits until every group has arrived at this round's end; returns whether all of them said
  /// `enough` (the same answer to each).
  bool arrive_and_wait(bool enough);

 private:
  const int groups_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  int arrived_ = 0;
  int enough_ = 0;
  uint64_t generation_ = 0;
  bool last_answer_ = false;
};

/// Wall seconds from `start` until now.
double seconds_since(clock_type::time_point start);

/// The middle value of `values` (0 for none).
double median(std::vector<double> values);

/// The spread of the logarithms of the times in `groups` (each group the times of one kind of
/// work), robust to outliers: the interquartile range of log(time / its group's median),
/// pooled over the groups, over 1.349 (a normal distribution's standard deviation). Groups of
/// fewer than 4 times are left out; 0 when none is left.
double log_spread(const std::vector<const std::vector<double>*>& groups);

/// CPU seconds so far on `clock`: CLOCK_THREAD_CPUTIME_ID (this thread's) or
/// CLOCK_PROCESS_CPUTIME_ID (all of this process's threads').
double cpu_seconds(clockid_t clock);

/// A message of `kind` whose one payload is `bytes` of floats (at least one float).
transport::message filled_message(transport::message_kind kind, size_t bytes);

/// `batch` samples of shape `sample`, every element 0.5, on `device`.
layers::tensor batched(layers::backend& device, const layers::shape& sample, int64_t batch);

/// A forward key message of `samples` × `shape` on `device`, with its labels, as a stage sends
/// one.
actors::key_message sample_key(layers::backend& device, const layers::shape& shape,
                               int64_t samples);

/// CPU seconds one end of a key's message of `samples` × `shape` costs over `address`
/// (ipc://, between worker processes; -1 when it fails), as a stage sends and receives one: the
/// engine's own wire encoding of the key (its payload copied off the device) and the send on this
/// thread, a receiver thread that wakes, decodes the key onto the device and hands it over, and
/// this thread woken in turn. The process's CPU time over `rounds` messages, halved: each end gets
/// its share; the median wall time of one message goes to `latency_s`. The sender's context is one
/// of its own (its own ZeroMQ I/O thread, as in another process).
double message_cpu_seconds(transport::transport_context& context,
                           transport::transport_context& sending_context,
                           const std::string& address, layers::backend& device,
                           const layers::shape& shape, int64_t samples, int rounds,
                           double* latency_s);

/// CPU seconds one end of a key's message costs between two threads of one process over
/// `address` (inproc://; -1 when it fails), on the engine's in-process path: the sender encodes
/// the key, sends it and tells the receiving thread (as a take_atom tells a stage's actor),
/// which wakes, takes it from its own inbox and decodes it onto the device; no receiver thread
/// in between. Halved process CPU time over `rounds` messages; the median wall time of one
/// message from its send to its decoding goes to `latency_s`.
double taken_message_cpu_seconds(transport::transport_context& context, const std::string& address,
                                 layers::backend& device, const layers::shape& shape,
                                 int64_t samples, int rounds, double* latency_s);

/// Seconds `work` takes on `device`, until its stream is idle.
template <class work_type>
double timed(layers::backend& device, work_type&& work) {
  const auto begin = clock_type::now();
  work();
  device.synchronize(device.default_stream());
  return seconds_since(begin);
}

/// CPU seconds per sample the coordinator spends on a key of `batch` random samples of `train`:
/// their rows gathered into the key's payload on `host` and the key encoded for the wire, as
/// the coordinator admits keys (the median over `seconds` of keys, at least 5).
double coordinator_seconds_per_sample(const layers::dataset& train, int64_t batch,
                                      layers::backend& host, double seconds);

}  // namespace troupe::sim
