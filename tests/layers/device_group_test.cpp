// Replica groups: ranks that sum buffers in place. The shared-memory group runs everywhere;
// the NCCL group needs a GPU per rank and skips itself without them.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "layers/backend_registry.h"
#include "layers/device_group.h"
#include "layers/tensor.h"

namespace troupe::layers {
namespace {

/// Rank r's values of round k: distinct per rank, round and element, not exact in binary.
std::vector<float> contribution(int rank, int round, size_t count) {
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) {
    values[i] = 0.1f * static_cast<float>(rank + 1) + 0.01f * static_cast<float>(round) +
                0.001f * static_cast<float>(i % 97);
  }
  return values;
}

std::vector<float> rank_order_sum(int ranks, int round, size_t count) {
  std::vector<float> sum(count, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> values = contribution(r, round, count);
    for (size_t i = 0; i < count; ++i) sum[i] += values[i];
  }
  return sum;
}

TEST(DeviceGroupTest, SharedMemoryRanksEndWithTheSameSumRoundAfterRound) {
  constexpr int kRanks = 3, kRounds = 4;
  constexpr size_t kCount = 1000;
  auto group = make_shared_memory_group(kRanks);
  ASSERT_EQ(group.size(), static_cast<size_t>(kRanks));
  std::vector<std::vector<std::vector<float>>> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(group[r]->rank(), r);
    EXPECT_EQ(group[r]->ranks(), kRanks);
    threads.emplace_back([&, r] {
      for (int round = 0; round < kRounds; ++round) {
        std::vector<float> buffer = contribution(r, round, kCount);
        std::vector<float> small = contribution(r, round + 10, 3);
        group[r]->all_reduce_sum(stream{}, {{buffer.data(), buffer.size()}, {small.data(), 3}});
        EXPECT_EQ(small, rank_order_sum(kRanks, round + 10, 3));
        results[r].push_back(buffer);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int round = 0; round < kRounds; ++round) {
    const std::vector<float> expected = rank_order_sum(kRanks, round, kCount);
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_EQ(results[r].size(), static_cast<size_t>(kRounds));
      EXPECT_EQ(results[r][round], expected) << "rank " << r << " round " << round;
    }
  }
}

TEST(DeviceGroupTest, NcclIsRefusedWithoutCudaDevices) {
  std::string error;
  auto cpu = create_backend("cpu", 1, &error);
  ASSERT_TRUE(cpu) << error;
  auto groups = join_nccl_groups({{cpu.get(), std::string(256, '0'), 0, 1}}, 1.0, &error);
  EXPECT_TRUE(groups.empty());
  EXPECT_NE(error.find("CUDA"), std::string::npos) << error;
}

/// Every GPU of this machine as one rank of one NCCL group, joined from one thread.
TEST(DeviceGroupTest, NcclRanksOnEveryGpuSumInPlace) {
  if (!nccl_compiled() || cuda_device_count() == 0) GTEST_SKIP() << "no NCCL or no GPU";
  const int ranks = cuda_device_count();
  std::string error;
  const std::string id = make_nccl_group_id(&error);
  ASSERT_FALSE(id.empty()) << error;
  std::vector<std::unique_ptr<backend>> devices;
  std::vector<nccl_member> members;
  for (int r = 0; r < ranks; ++r) {
    devices.push_back(create_backend("cuda:" + std::to_string(r), 1, &error));
    ASSERT_TRUE(devices.back()) << error;
    members.push_back({devices.back().get(), id, r, ranks});
  }
  auto groups = join_nccl_groups(members, 60.0, &error);
  ASSERT_EQ(groups.size(), static_cast<size_t>(ranks)) << error;
  constexpr size_t kCount = 3000;
  std::vector<tensor> buffers;
  for (int r = 0; r < ranks; ++r) {
    backend& device = *devices[r];
    buffers.push_back(tensor::from_host(device, device.default_stream(),
                                        shape{static_cast<int64_t>(kCount)},
                                        contribution(r, 0, kCount)));
    device.synchronize(device.default_stream());
  }
  // A thread per rank, as each stage actor has one (NCCL's calls for several GPUs from one
  // thread would have to share one group call).
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(groups[r]->kind(), "nccl");
    threads.emplace_back([&, r] {
      groups[r]->all_reduce_sum(devices[r]->default_stream(), {{buffers[r].data(), kCount}});
    });
  }
  for (std::thread& thread : threads) thread.join();
  const std::vector<float> expected = rank_order_sum(ranks, 0, kCount);
  std::vector<float> first;
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> sum = buffers[r].to_host(devices[r]->default_stream());
    for (size_t i = 0; i < kCount; ++i) ASSERT_NEAR(sum[i], expected[i], 1e-5f) << r << " " << i;
    if (r == 0) first = sum;
    EXPECT_EQ(sum, first) << "rank " << r << " ended with other bits than rank 0";
  }
}

TEST(DeviceGroupTest, NcclRefusesAGroupIdThatIsNotOne) {
  if (!nccl_compiled() || cuda_device_count() == 0) GTEST_SKIP() << "no NCCL or no GPU";
  std::string error;
  auto device = create_backend("cuda:0", 1, &error);
  ASSERT_TRUE(device) << error;
  auto groups = join_nccl_groups({{device.get(), "not hex", 0, 1}}, 5.0, &error);
  EXPECT_TRUE(groups.empty());
  EXPECT_NE(error.find("hex digits"), std::string::npos) << error;
}

}  // namespace
}  // namespace troupe::layers
