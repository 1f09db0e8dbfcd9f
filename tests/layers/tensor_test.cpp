#include <gtest/gtest.h>

#include "layers/backend_registry.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers {
namespace {

TEST(TensorTest, HostRoundTripAndShapes) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  tensor t = tensor::from_host(*device, s, {2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t.size(), 6);
  EXPECT_EQ(t.rows(), 2);
  EXPECT_EQ(t.row_size(), 3);
  EXPECT_EQ(t.to_host(s), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(to_string(t.dims()), "[2, 3]");
}

TEST(TensorTest, CopiesShareDataAndCloneDoesNot) {
  auto device = testing::cpu_backend();
  stream s = device->default_stream();
  tensor t = tensor::filled(*device, s, {4}, 1.0f);
  tensor shared = t.reshaped({2, 2});
  tensor copy = t.clone(s);
  device->fill(s, t.data(), 3.0f, 4);
  EXPECT_EQ(shared.to_host(s), (std::vector<float>(4, 3.0f)));
  EXPECT_EQ(copy.to_host(s), (std::vector<float>(4, 1.0f)));
}

TEST(BackendRegistryTest, CreatesCpuAndRejectsUnknownDevices) {
  std::string error;
  auto cpu = create_backend("cpu", 1, &error);
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->name(), "cpu");
  EXPECT_EQ(create_backend("tpu", 1, &error), nullptr);
  EXPECT_NE(error.find("unknown device 'tpu'"), std::string::npos) << error;
  if (cuda_device_count() == 0) {
    EXPECT_EQ(create_backend("cuda:0", 1, &error), nullptr);
    EXPECT_FALSE(error.empty());
  }
}

}  // namespace
}  // namespace troupe::layers
