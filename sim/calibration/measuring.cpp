#include "sim/calibration/measuring.h"

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "actors/hosts/wire_format.h"

namespace troupe::sim {

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
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

double message_cpu_seconds(transport::transport_context& context,
                           transport::transport_context& sending_context,
                           const std::string& address, layers::backend& device,
                           const layers::shape& shape, int64_t samples, int rounds,
                           double* latency_s) {
  transport::endpoint_error problem;
  auto in = transport::inbox::bind(context, address, {}, &problem);
  auto out = in ? transport::outbox::connect(sending_context, address, {}, &problem) : std::nullopt;
  if (!in || !out) return -1;
  std::mutex mutex;
  std::condition_variable arrived;
  int received = 0;
  std::vector<transport::inbox> inboxes;
  inboxes.push_back(std::move(*in));
  transport::receiver_thread receiver(
      context, std::move(inboxes), [&](transport::message&& incoming) {
        std::string ignored;
        auto key = actors::key_from_wire(incoming, device, &ignored);
        std::lock_guard<std::mutex> lock(mutex);
        received += key ? 1 : 0;
        arrived.notify_one();
      });
  actors::key_message key;
  key.kind = actors::key_kind::forward;
  key.payload = batched(device, shape, samples);
  key.labels = std::make_shared<const std::vector<int32_t>>(static_cast<size_t>(samples), 0);
  const actors::wire_route route{1, 0, 1, 0, 0.0};
  const double start = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  std::vector<double> latencies;
  for (int r = 0; r < rounds; ++r) {
    const auto begin = clock_type::now();
    key.key = static_cast<uint64_t>(r);
    if (!out->send_waiting(actors::to_wire(key, route), std::chrono::seconds(10)).ok()) return -1;
    std::unique_lock<std::mutex> lock(mutex);
    if (!arrived.wait_for(lock, std::chrono::seconds(10), [&] { return received > r; })) return -1;
    latencies.push_back(seconds_since(begin));
  }
  *latency_s = median(latencies);
  return (cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - start) / rounds / 2;
}

}  // namespace troupe::sim
