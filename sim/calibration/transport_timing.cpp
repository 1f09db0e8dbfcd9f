#include "sim/calibration/transport_timing.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "sim/calibration/measuring.h"
#include "transport/endpoint.h"

namespace troupe::sim {
namespace {

/// One-way time of a message of `bytes` between two ipc:// endpoints of this process.
double message_seconds(transport::outbox& out, transport::inbox& in, size_t bytes, int rounds) {
  const transport::message message = filled_message(transport::message_kind::forward, bytes);
  std::vector<double> times;
  for (int r = 0; r < rounds; ++r) {
    const auto begin = clock_type::now();
    if (!out.send_waiting(message, std::chrono::seconds(10)).ok()) return -1;
    auto received = in.receive(std::chrono::seconds(10));
    if (!received || !received->ok()) return -1;
    times.push_back(seconds_since(begin));
  }
  return median(times);
}

/// CPU seconds of one end of a message: a fixed part and a part per payload byte.
struct message_cost {
  double fixed_s = -1;  ///< -1: a measurement failed
  double per_byte_s = 0;
};

/// The line through (`small_bytes`, `small_s`) and (`big_bytes`, `big_s`), its slope at least 0
/// and its fixed part at least half the small message's time (both measured: a noisy pair
/// must not make messages free).
message_cost line_through(double small_s, double big_s, double small_bytes, double big_bytes) {
  if (small_s <= 0 || big_s <= 0) return {};
  if (big_bytes <= small_bytes) return {big_s, 0};
  const double per_byte = std::max(0.0, (big_s - small_s) / (big_bytes - small_bytes));
  return {std::max(small_s / 2, small_s - per_byte * small_bytes), per_byte};
}

/// Bytes of the payload of a key of `samples` × `sample`.
double bytes_of(const layers::shape& sample, int64_t samples) {
  return static_cast<double>(samples * layers::element_count(sample) * int64_t{sizeof(float)});
}

}  // namespace

bool time_transport(machine_profile* profile, layers::backend& device, const layers::shape& input,
                    const layers::shape& biggest, int64_t biggest_samples, std::string* error) {
  char pattern[] = "/tmp/troupe-calibrate-XXXXXX";
  if (!mkdtemp(pattern)) {
    *error = "cannot create a directory for the ipc:// endpoints";
    return false;
  }
  const std::string address = std::string("ipc://") + pattern + "/link";
  bool ok = false;
  {
    transport::transport_context context;
    transport::endpoint_options options;
    options.receive_high_water_mark = 16;
    transport::endpoint_error problem;
    auto in = transport::inbox::bind(context, address, options, &problem);
    auto out = in ? transport::outbox::connect(context, address, options, &problem) : std::nullopt;
    if (!in || !out) {
      *error = problem.text;
    } else {
      const size_t small = 64, large = size_t{4} << 20;
      const double latency = message_seconds(*out, *in, small, 200);
      const double big = message_seconds(*out, *in, large, 20);
      // A message's CPU at one sample of the input and at a key of the job's biggest message:
      // a fixed part and a part per byte. In one process each stage's actor takes its messages
      // from its own inbox.
      double ipc_latency = 0, small_latency = 0;
      transport::transport_context other_process;
      const std::string inproc = "inproc://troupe-calibrate-" + std::to_string(getpid());
      const message_cost ipc_cost =
          line_through(message_cpu_seconds(context, other_process, address + "-cpu-small", device,
                                           input, 1, 200, &ipc_latency),
                       message_cpu_seconds(context, other_process, address + "-cpu", device,
                                           biggest, biggest_samples, 200, &ipc_latency),
                       bytes_of(input, 1), bytes_of(biggest, biggest_samples));
      const message_cost inproc_cost =
          line_through(taken_message_cpu_seconds(context, inproc + "-small", device, input, 1, 200,
                                                 &small_latency),
                       taken_message_cpu_seconds(context, inproc, device, biggest, biggest_samples,
                                                 200, &profile->inproc_latency_s),
                       bytes_of(input, 1), bytes_of(biggest, biggest_samples));
      ok = latency > 0 && big > latency && ipc_cost.fixed_s > 0 && inproc_cost.fixed_s > 0;
      if (ok) {
        profile->link_latency_s = latency;
        profile->link_bandwidth = static_cast<double>(large - small) / (big - latency);
        profile->ipc_message_cpu_s = ipc_cost.fixed_s;
        profile->ipc_message_cpu_per_byte_s = ipc_cost.per_byte_s;
        profile->inproc_message_cpu_s = inproc_cost.fixed_s;
        profile->inproc_message_cpu_per_byte_s = inproc_cost.per_byte_s;
        // The latency of a key of the input's size, not of the biggest message.
        profile->inproc_latency_s = std::min(profile->inproc_latency_s, small_latency);
      } else {
        *error = "the ipc:// round of the transport measurement failed";
      }
    }
  }
  std::remove((std::string(pattern) + "/link").c_str());
  std::remove((std::string(pattern) + "/link-cpu").c_str());
  std::remove((std::string(pattern) + "/link-cpu-small").c_str());
  rmdir(pattern);
  return ok;
}

}  // namespace troupe::sim
