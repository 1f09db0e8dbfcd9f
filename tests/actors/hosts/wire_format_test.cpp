// Key messages as ZeroMQ frames: on the CPU the frame is the tensor's own memory; on any other
// device it is one copy in a pinned host buffer that the frame owns and gives back to the
// backend when released, sent over ZeroMQ without another copy; decoding puts the payload on
// the receiving device, finished.

#include "actors/hosts/wire_format.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "layers/backend_registry.h"
#include "tests/support/test_helpers.h"
#include "transport/endpoint.h"

namespace troupe::actors {
namespace {

using layers::backend;
using layers::stream;

/// The CPU backend reporting itself as a GPU, which counts its host buffers: what a device
/// with its own memory looks like to the wire format.
class device_like_backend final : public backend {
 public:
  device_like_backend() : cpu_(testing::cpu_backend()) {}

  std::atomic<int> host_buffers_out{0};
  std::atomic<int> host_buffers_made{0};

  std::string name() const override { return "device-like"; }
  layers::device_kind kind() const override { return layers::device_kind::cuda; }
  void* allocate(size_t bytes) override { return cpu_->allocate(bytes); }
  void deallocate(void* pointer) override { cpu_->deallocate(pointer); }
  void* allocate_host(size_t bytes) override {
    ++host_buffers_out;
    ++host_buffers_made;
    return cpu_->allocate_host(bytes);
  }
  void deallocate_host(void* pointer) override {
    --host_buffers_out;
    cpu_->deallocate_host(pointer);
  }
  void copy_host_to_device(stream s, void* device, const void* host, size_t bytes) override {
    cpu_->copy_host_to_device(s, device, host, bytes);
  }
  void copy_device_to_host(stream s, void* host, const void* device, size_t bytes) override {
    cpu_->copy_device_to_host(s, host, device, bytes);
  }
  void copy_device_to_device(stream s, void* target, const void* source, size_t bytes) override {
    cpu_->copy_device_to_device(s, target, source, bytes);
  }
  void fill(stream s, float* data, float value, size_t count) override {
    cpu_->fill(s, data, value, count);
  }
  stream default_stream() override { return cpu_->default_stream(); }
  stream create_stream() override { return cpu_->create_stream(); }
  void destroy_stream(stream s) override { cpu_->destroy_stream(s); }
  void synchronize(stream s) override { cpu_->synchronize(s); }
  layers::event create_event() override { return cpu_->create_event(); }
  void destroy_event(layers::event e) override { cpu_->destroy_event(e); }
  void record_event(layers::event e, stream s) override { cpu_->record_event(e, s); }
  void wait_event(stream s, layers::event e) override { cpu_->wait_event(s, e); }
  void synchronize_event(layers::event e) override { cpu_->synchronize_event(e); }
  void set_gemm_precision(stream s, layers::math_precision p) override {
    cpu_->set_gemm_precision(s, p);
  }
  // The wire format does no arithmetic; nothing below may be called.
  void gemm(stream, layers::transpose, layers::transpose, int, int, int, float, const float*, int,
            const float*, int, float, float*, int) override {
    FAIL();
  }
  void add_row_vector(stream, float*, const float*, int, int) override { FAIL(); }
  void sum_rows(stream, const float*, int, int, float, float*) override { FAIL(); }
  void add_channel_vector(stream, float*, const float*, int, int, int) override { FAIL(); }
  void sum_channels(stream, const float*, int, int, int, float, float*) override { FAIL(); }
  void transpose_batched(stream, const float*, float*, int, int, int) override { FAIL(); }
  void copy_matrix(stream, const float*, int, float*, int, int, int) override { FAIL(); }
  void axpy(stream, float, const float*, float*, size_t) override { FAIL(); }
  void multiply(stream, const float*, const float*, float*, size_t) override { FAIL(); }
  void sum(stream, const float*, size_t, float*) override { FAIL(); }
  void gemm_batched(stream, layers::transpose, layers::transpose, int, int, int, float,
                    const float*, int, int64_t, const float*, int, int64_t, float, float*, int,
                    int64_t, int) override {
    FAIL();
  }
  void layer_norm_forward(stream, const float*, const float*, const float*, float*, float*, float*,
                          int, int, float) override {
    FAIL();
  }
  void layer_norm_backward(stream, const float*, const float*, const float*, const float*, float*,
                           int, int) override {
    FAIL();
  }
  void causal_softmax_forward(stream, const float*, float*, int, int, float) override { FAIL(); }
  void softmax_backward(stream, const float*, const float*, float*, int, int, float) override {
    FAIL();
  }
  void lstm_cell_forward(stream, const layers::lstm_cell_geometry&, float*, const float*,
                         float*) override {
    FAIL();
  }
  void lstm_cell_backward(stream, const layers::lstm_cell_geometry&, const float*, const float*,
                          const float*, const float*, float*, float*) override {
    FAIL();
  }
  void embedding_forward(stream, const float*, const float*, float*, int, int, int) override {
    FAIL();
  }
  void embedding_backward(stream, const float*, const float*, float*, int, int, int,
                          float) override {
    FAIL();
  }
  void activation_forward(stream, layers::activation, const float*, float*, size_t) override {
    FAIL();
  }
  void activation_backward(stream, layers::activation, const float*, const float*, const float*,
                           float*, size_t) override {
    FAIL();
  }
  void softmax_cross_entropy(stream, const float*, const int32_t*, int, int, float, float*, float*,
                             float*) override {
    FAIL();
  }
  void im2col(stream, const layers::convolution_geometry&, const float*, float*) override {
    FAIL();
  }
  void col2im(stream, const layers::convolution_geometry&, const float*, float*) override {
    FAIL();
  }
  void max_pool_forward(stream, const layers::pooling_geometry&, const float*, float*,
                        int32_t*) override {
    FAIL();
  }
  void max_pool_backward(stream, const layers::pooling_geometry&, const float*, const int32_t*,
                         float*) override {
    FAIL();
  }
  void dropout_forward(stream, const float*, float*, float*, size_t, float, uint64_t,
                       uint64_t) override {
    FAIL();
  }
  void sgd_step(stream, float*, const float*, float*, size_t,
                const layers::sgd_parameters&) override {
    FAIL();
  }
  void adam_step(stream, float*, const float*, float*, float*, size_t,
                 const layers::adam_parameters&) override {
    FAIL();
  }

 private:
  std::unique_ptr<backend> cpu_;
};

key_message forward_message(backend& device, const std::vector<float>& values) {
  key_message message;
  message.kind = key_kind::forward;
  message.key = 7;
  message.step = 3;
  message.payload = layers::tensor::from_host(device, device.default_stream(),
                                              {static_cast<int64_t>(values.size()) / 4, 4}, values);
  message.labels = std::make_shared<const std::vector<int32_t>>(values.size() / 4, 1);
  return message;
}

/// A sequence of three parts and a tree ((a b) c), as a dynamic model's key carries them.
std::shared_ptr<const std::vector<layers::instance>> two_instances() {
  layers::instance sequence;
  sequence.tokens = {4, 5, 6};
  sequence.labels = {5, 6, 7};
  layers::instance tree;
  tree.tokens = {1, 2, 15, 3, 15};
  tree.parent = {2, 2, 4, 4, -1};
  tree.labels = {9};
  return std::make_shared<const std::vector<layers::instance>>(
      std::vector<layers::instance>{sequence, tree});
}

bool same_instances(const std::vector<layers::instance>& a,
                    const std::vector<layers::instance>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].tokens != b[i].tokens || a[i].parent != b[i].parent || a[i].labels != b[i].labels)
      return false;
  }
  return true;
}

TEST(WireFormatTest, ADynamicModelsInstancesTravelWithItsKeyBothWays) {
  auto device = testing::cpu_backend();
  key_message message = forward_message(*device, testing::random_values(32, 3));
  message.instances = two_instances();
  std::string error;
  auto forward = key_from_wire(to_wire(message, wire_route{}), *device, &error);
  ASSERT_TRUE(forward.has_value()) << error;
  ASSERT_TRUE(forward->instances);
  EXPECT_TRUE(same_instances(*forward->instances, *message.instances));
  EXPECT_EQ(*forward->labels, *message.labels) << "the labels frame stays the labels";
  // A backward message has no labels: the instances must not be taken for them.
  message.kind = key_kind::backward;
  message.labels.reset();
  auto backward = key_from_wire(to_wire(message, wire_route{}), *device, &error);
  ASSERT_TRUE(backward.has_value()) << error;
  EXPECT_FALSE(backward->labels);
  ASSERT_TRUE(backward->instances);
  EXPECT_TRUE(same_instances(*backward->instances, *message.instances));
}

TEST(WireFormatTest, AForgedInstancesFrameIsRefusedWithTheReason) {
  auto device = testing::cpu_backend();
  key_message message = forward_message(*device, testing::random_values(32, 4));
  message.instances = two_instances();
  const transport::message good = to_wire(message, wire_route{});
  const auto* frame = static_cast<const int32_t*>(good.payloads.back().data);
  const std::vector<int32_t> encoded(frame, frame + good.payloads.back().bytes / sizeof(int32_t));
  auto refusal = [&](std::vector<int32_t> values) {
    transport::message forged = good;
    forged.header.frames.pop_back();
    forged.payloads.pop_back();
    transport::add_payload(forged, {static_cast<int64_t>(values.size())},
                           std::make_shared<const std::vector<int32_t>>(std::move(values)));
    std::string error;
    EXPECT_FALSE(key_from_wire(forged, *device, &error).has_value());
    return error;
  };
  std::vector<int32_t> too_many = encoded;
  too_many[0] = 1000;  // more instances than the frame holds
  EXPECT_NE(refusal(too_many).find("count that fits"), std::string::npos);
  std::vector<int32_t> cut = encoded;
  cut.pop_back();
  EXPECT_NE(refusal(cut).find("do not fit"), std::string::npos);
  std::vector<int32_t> backwards = encoded;
  // The tree's first parent entry (after the sequence's 3 + 3 + 3 counts and values and the
  // tree's 3 counts and 5 tokens) points before its part.
  backwards[1 + 3 + 6 + 3 + 5] = 0;
  EXPECT_NE(refusal(backwards).find("not a tree"), std::string::npos);
  // Flagged, but its frames are only the payload.
  transport::message without_frame = good;
  without_frame.header.frames.resize(1);
  without_frame.payloads.resize(1);
  std::string error;
  EXPECT_FALSE(key_from_wire(without_frame, *device, &error).has_value());
  EXPECT_NE(error.find("lacks their int32 frame"), std::string::npos) << error;
}

TEST(WireFormatTest, CpuPayloadTravelsInPlace) {
  auto device = testing::cpu_backend();
  const key_message message = forward_message(*device, testing::random_values(64, 1));
  const transport::message wire = to_wire(message, wire_route{});
  ASSERT_EQ(wire.payloads.size(), 2u);
  EXPECT_EQ(wire.payloads[0].data, message.payload.data()) << "no copy on the CPU";
  EXPECT_EQ(wire.payloads[0].bytes, 64 * sizeof(float));
}

TEST(WireFormatTest, DevicePayloadTravelsInAHostBufferTheFrameGivesBack) {
  device_like_backend device;
  const std::vector<float> values = testing::random_values(256, 2);
  const key_message message = forward_message(device, values);
  {
    const transport::message wire = to_wire(message, wire_route{});
    EXPECT_EQ(device.host_buffers_out.load(), 1);
    const auto* data = static_cast<const float*>(wire.payloads[0].data);
    EXPECT_NE(static_cast<const void*>(data), message.payload.data());
    EXPECT_EQ(std::vector<float>(data, data + values.size()), values);
    // The receiving side: a finished tensor on its own device, its own memory.
    std::string error;
    auto received = key_from_wire(wire, device, &error);
    ASSERT_TRUE(received.has_value()) << error;
    EXPECT_EQ(received->payload.to_host(device.default_stream()), values);
    EXPECT_NE(static_cast<const void*>(received->payload.data()), wire.payloads[0].data);
    EXPECT_EQ(received->key, 7u);
    EXPECT_EQ(received->labels->size(), values.size() / 4);
  }
  EXPECT_EQ(device.host_buffers_out.load(), 0) << "the buffer goes back when the frame goes";
}

TEST(WireFormatTest, ZeroMqSendsTheHostBufferAndReleasesItAfterwards) {
  device_like_backend device;
  const std::vector<float> values = testing::random_values(4096, 3);
  transport::transport_context context;
  const std::string address = "inproc://wire-format-test";
  auto in = transport::inbox::bind(context, address);
  auto out = transport::outbox::connect(context, address);
  ASSERT_TRUE(in && out);
  for (int round = 0; round < 3; ++round) {
    key_message message = forward_message(device, values);
    ASSERT_TRUE(out->send(to_wire(message, wire_route{})).ok());
    auto received = in->receive(std::chrono::seconds(10));
    ASSERT_TRUE(received && received->ok());
    std::string error;
    auto decoded = key_from_wire(*received->value, device, &error);
    ASSERT_TRUE(decoded.has_value()) << error;
    EXPECT_EQ(decoded->payload.to_host(device.default_stream()), values);
  }
  // Every frame has been released (inproc hands the buffer itself to the receiver, which has
  // dropped it); one host buffer was made per message, no pageable copy besides.
  EXPECT_EQ(device.host_buffers_out.load(), 0);
  EXPECT_EQ(device.host_buffers_made.load(), 3);
}

}  // namespace
}  // namespace troupe::actors
