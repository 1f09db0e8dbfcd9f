// The CUDA backend's own behaviour: names, copies, streams and events, allocation under load,
// and streams driven from several threads. Every test skips itself without a CUDA device.

#include "tests/layers/cuda_test_support.h"

namespace troupe::layers {
namespace {

using namespace cuda_testing;

TEST(CudaBackendTest, NameKindAndDefaultStream) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  EXPECT_EQ(pair.cuda->name(), "cuda:0");
  EXPECT_EQ(pair.cuda->kind(), device_kind::cuda);
  EXPECT_NE(pair.cuda->default_stream().handle, nullptr);
  std::string error;
  EXPECT_EQ(create_backend("cuda:" + std::to_string(cuda_device_count()), 0, &error), nullptr);
  EXPECT_FALSE(error.empty());
}

TEST(CudaBackendTest, CopiesRoundTrip) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const std::vector<float> values = random_values(1000, 1);
  std::vector<float> expected(1000, -1.0f);
  std::copy(values.begin(), values.begin() + 500, expected.begin() + 100);
  expect_parity(
      pair,
      [&](backend& device) {
        device_array<float> source(device, values);
        device_array<float> target(device, 1000);
        const stream s = device.default_stream();
        device.fill(s, target.data(), -1.0f, 1000);
        device.copy_device_to_device(s, target.data() + 100, source.data(), 500 * sizeof(float));
        return outputs{source.download(), target.download()};
      },
      exact, "copies");
  device_array<float> source(*pair.cuda, values);
  EXPECT_EQ(source.download(), values);
}

TEST(CudaBackendTest, FillCounts) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  for (size_t count : {size_t{0}, size_t{1}, size_t{255}, size_t{257}, size_t{1000003}}) {
    std::vector<float> expected(count + 1, 3.5f);
    expected[count] = 7.0f;  // a guard element that must stay untouched
    const auto op = [&](backend& device) {
      device_array<float> data(device, std::vector<float>(count + 1, 7.0f));
      device.fill(device.default_stream(), data.data(), 3.5f, count);
      return outputs{data.download()};
    };
    expect_close(expected, op(*pair.cuda)[0], exact, "fill " + std::to_string(count));
    expect_parity(pair, op, exact, "fill " + std::to_string(count));
  }
}

TEST(CudaBackendTest, EventsOrderStreams) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const size_t count = size_t{1} << 22;
  for (backend* device : {pair.cpu.get(), pair.cuda.get()}) {
    device_array<float> ones(*device, count), total(*device, count), copy(*device, count);
    const stream producer = device->create_stream();
    const stream consumer = device->create_stream();
    const event produced = device->create_event();
    // A long chain on the producer; the consumer copies the result only after the event.
    device->fill(producer, ones.data(), 1.0f, count);
    device->fill(producer, total.data(), 0.0f, count);
    for (int i = 0; i < 20; ++i) device->axpy(producer, 1.0f, ones.data(), total.data(), count);
    device->record_event(produced, producer);
    device->wait_event(consumer, produced);
    device->copy_device_to_device(consumer, copy.data(), total.data(), count * sizeof(float));
    std::vector<float> copied(count);
    device->copy_device_to_host(consumer, copied.data(), copy.data(), count * sizeof(float));
    device->synchronize(consumer);
    EXPECT_EQ(copied, std::vector<float>(count, 20.0f)) << device->name();
    // The host waits for an event, then reads on another stream without synchronizing.
    device->axpy(producer, 1.0f, ones.data(), total.data(), count);
    device->record_event(produced, producer);
    device->synchronize_event(produced);
    EXPECT_EQ(total.download(), std::vector<float>(count, 21.0f)) << device->name();
    device->synchronize(producer);
    device->destroy_event(produced);
    device->destroy_stream(consumer);
    device->destroy_stream(producer);
  }
}

void* address(uintptr_t value) { return reinterpret_cast<void*>(value); }

TEST(CudaBackendTest, ManyAllocations) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  backend& device = *pair.cuda;
  const stream s = device.default_stream();
  for (int round = 0; round < 3; ++round) {
    std::vector<std::pair<uintptr_t, size_t>> buffers;
    for (size_t i = 0; i < 1000; ++i) {
      const size_t bytes = i % 97 == 0 ? 0 : (i * 7919 + round * 131) % 100000 + 1;
      auto* pointer = static_cast<char*>(device.allocate(bytes));
      ASSERT_NE(pointer, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(pointer) % 64, 0u);
      device.fill(s, reinterpret_cast<float*>(pointer), float(i), bytes / sizeof(float));
      buffers.emplace_back(reinterpret_cast<uintptr_t>(pointer), bytes);
    }
    // Each buffer still holds its own value, so no two overlap.
    for (size_t i = 0; i < buffers.size(); ++i) {
      const size_t floats = buffers[i].second / sizeof(float);
      if (floats == 0) continue;
      float first = -1.0f, last = -1.0f;
      device.copy_device_to_host(s, &first, address(buffers[i].first), sizeof(float));
      device.copy_device_to_host(s, &last, address(buffers[i].first + (floats - 1) * sizeof(float)),
                                 sizeof(float));
      device.synchronize(s);
      ASSERT_EQ(first, float(i));
      ASSERT_EQ(last, float(i));
    }
    std::sort(buffers.begin(), buffers.end());
    for (size_t i = 1; i < buffers.size(); ++i) {
      EXPECT_LE(buffers[i - 1].first + buffers[i - 1].second, buffers[i].first);
    }
    for (size_t i = 0; i < buffers.size(); i += 2) device.deallocate(address(buffers[i].first));
    for (size_t i = 1; i < buffers.size(); i += 2) device.deallocate(address(buffers[i].first));
  }
  void* large = device.allocate(size_t{1} << 30);
  device.fill(s, static_cast<float*>(large), 1.0f, (size_t{1} << 30) / sizeof(float));
  device.synchronize(s);
  device.deallocate(large);
}

TEST(CudaBackendTest, PinnedHostBuffersCopyAndAreReused) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  backend& device = *pair.cuda;
  const size_t count = 100000;
  const std::vector<float> values = random_values(count, 61);
  device_array<float> data(device, values);
  const stream s = device.create_stream();
  auto* host = static_cast<float*>(device.allocate_host(count * sizeof(float)));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(host) % 64, 0u);
  device.copy_device_to_host(s, host, data.data(), count * sizeof(float));
  device.synchronize(s);
  EXPECT_EQ(std::vector<float>(host, host + count), values);
  for (size_t i = 0; i < count; ++i) host[i] = -host[i];
  device.copy_host_to_device(s, data.data(), host, count * sizeof(float));
  device.synchronize(s);
  EXPECT_EQ(data.download()[7], -values[7]);
  device.deallocate_host(host);
  // A returned buffer serves the next request of its size class.
  EXPECT_EQ(device.allocate_host(count * sizeof(float) - 100), static_cast<void*>(host));
  device.deallocate_host(host);
  // Buffers come back from other threads (ZeroMQ's I/O threads release frames).
  std::vector<void*> buffers;
  for (int i = 0; i < 64; ++i) buffers.push_back(device.allocate_host(size_t(i + 1) * 1000));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < buffers.size(); i += 4) device.deallocate_host(buffers[i]);
    });
  }
  for (auto& thread : threads) thread.join();
  device.destroy_stream(s);
}

TEST(CudaBackendTest, ConcurrentStreamsFromThreads) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const int n = 96;
  const auto a = random_values(n * n, 171);
  const auto b = random_values(n * n, 172);
  // Each stage-like thread runs GEMM and a reduction on its own stream of the same backend.
  const auto run = [&](backend& device, std::vector<float>* result) {
    const stream s = device.create_stream();
    const size_t bytes = size_t(n) * n * sizeof(float);
    auto* da = static_cast<float*>(device.allocate(bytes));
    auto* db = static_cast<float*>(device.allocate(bytes));
    auto* dc = static_cast<float*>(device.allocate(bytes + sizeof(float)));  // C, then the sum
    device.copy_host_to_device(s, da, a.data(), bytes);
    device.copy_host_to_device(s, db, b.data(), bytes);
    for (int repeat = 0; repeat < 20; ++repeat) {
      device.gemm(s, transpose::no, transpose::yes, n, n, n, 1.0f, da, n, db, n, 0.0f, dc, n);
      device.sum(s, dc, size_t(n) * n, dc + n * n);
    }
    result->resize(size_t(n) * n + 1);
    device.copy_device_to_host(s, result->data(), dc, bytes + sizeof(float));
    device.synchronize(s);
    device.destroy_stream(s);
    for (float* pointer : {da, db, dc}) device.deallocate(pointer);
  };
  std::vector<float> expected;
  run(*pair.cpu, &expected);
  std::vector<std::vector<float>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) threads.emplace_back(run, std::ref(*pair.cuda), &result);
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) {
    expect_close(std::vector<float>(expected.begin(), expected.end() - 1),
                 std::vector<float>(result.begin(), result.end() - 1), summed(n), "gemm");
    EXPECT_NEAR(expected.back(), result.back(), 1e-3) << "sum";
    EXPECT_EQ(result, results[0]) << "streams disagree bit for bit";
  }
}

}  // namespace
}  // namespace troupe::layers
