#include "transport/endpoint.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <zmq.hpp>

#include "tests/support/polling.h"

namespace troupe::transport {
namespace {

using namespace std::chrono_literals;

using testing::eventually;

const std::vector<float> activations = {0.5f, -1.25f, 3.0f, 1e-7f, -0.0f, 65504.0f};
const std::vector<int32_t> labels = {3, 9};

message tensor_message(uint64_t key) {
  message result;
  result.header.kind = message_kind::forward;
  result.header.job_id = 11;
  result.header.key = key;
  result.header.source_stage = 0;
  result.header.target_stage = 1;
  add_payload(result, {2, 3}, std::make_shared<const std::vector<float>>(activations));
  add_payload(result, {2}, std::make_shared<const std::vector<int32_t>>(labels));
  return result;
}

void expect_tensor_message(const message& received, uint64_t key) {
  EXPECT_EQ(received.header, tensor_message(key).header);
  ASSERT_EQ(received.payloads.size(), 2u);
  ASSERT_EQ(received.payloads[0].bytes, activations.size() * sizeof(float));
  EXPECT_EQ(0, std::memcmp(received.payloads[0].data, activations.data(),
                           activations.size() * sizeof(float)));
  ASSERT_EQ(received.payloads[1].bytes, labels.size() * sizeof(int32_t));
  EXPECT_EQ(0, std::memcmp(received.payloads[1].data, labels.data(), labels.size() * 4));
}

// Collects what a receiver_thread hands over and lets the test wait for it with a deadline.
struct collector {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<message> messages;
  std::vector<decode_error> drops;

  void add(message&& received) {
    std::lock_guard<std::mutex> lock(mutex);
    messages.push_back(std::move(received));
    changed.notify_all();
  }
  void drop(const std::string& /*address*/, const decode_error& error) {
    std::lock_guard<std::mutex> lock(mutex);
    drops.push_back(error);
    changed.notify_all();
  }
  bool wait_for(size_t message_count, size_t drop_count) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(
        lock, 10s, [&] { return messages.size() >= message_count && drops.size() >= drop_count; });
  }
};

void round_trip(const std::string& bind_address) {
  transport_context context;
  endpoint_error error;
  std::optional<inbox> in = inbox::bind(context, bind_address, {}, &error);
  ASSERT_TRUE(in) << error.text;
  std::optional<outbox> out = outbox::connect(context, in->address(), {}, &error);
  ASSERT_TRUE(out) << error.text;
  ASSERT_TRUE(out->send(tensor_message(5)).ok());
  std::optional<decode_result> received = in->receive(10s);
  ASSERT_TRUE(received && received->ok()) << (received ? received->error.text : "timeout");
  expect_tensor_message(*received->value, 5);
}

TEST(EndpointTest, StageAddressesForEachScheme) {
  EXPECT_EQ(inproc_prefix(7), "inproc://troupe-7");
  EXPECT_EQ(stage_address(inproc_prefix(7), 3), "inproc://troupe-7/stage-3");
  EXPECT_EQ(stage_address("ipc:///run/troupe-7", 0), "ipc:///run/troupe-7/stage-0");
  EXPECT_EQ(stage_address("tcp://10.0.0.5:5550", 3), "tcp://10.0.0.5:5553");
  EXPECT_EQ(stage_address("tcp://[::1]:5550", 1), "tcp://[::1]:5551");
  EXPECT_EQ(stage_address("tcp://10.0.0.5", 3), "");
  EXPECT_EQ(stage_address("tcp://10.0.0.5:65535", 1), "");
  EXPECT_EQ(stage_address("udp://10.0.0.5:5550", 1), "");
  EXPECT_EQ(stage_address(inproc_prefix(7), -1), "");
}

TEST(EndpointTest, SendsFloatTensorAndLabelsOverInproc) {
  round_trip(stage_address(inproc_prefix(1), 0));
}

TEST(EndpointTest, SameCodeRunsOverTcpAndIpc) {
  round_trip("tcp://127.0.0.1:*");
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() / ("troupe-transport-" + std::to_string(getpid()));
  std::filesystem::create_directories(directory);
  round_trip(stage_address("ipc://" + directory.string(), 2));
  std::filesystem::remove_all(directory);
}

TEST(EndpointTest, BadAddressesAreErrorValues) {
  transport_context context;
  endpoint_error error;
  EXPECT_FALSE(inbox::bind(context, "bogus://nowhere", {}, &error));
  EXPECT_NE(error.text.find("bogus://nowhere"), std::string::npos) << error.text;
  std::optional<inbox> first = inbox::bind(context, "inproc://taken");
  ASSERT_TRUE(first);
  EXPECT_FALSE(inbox::bind(context, "inproc://taken", {}, &error));
  EXPECT_FALSE(outbox::connect(context, "tcp://no-port", {}, &error));
}

TEST(EndpointTest, OutboxRefusesInvalidMessages) {
  transport_context context;
  std::optional<outbox> out = outbox::connect(context, "inproc://refuses");
  ASSERT_TRUE(out);
  message broken = tensor_message(1);
  broken.payloads.pop_back();
  send_result result = out->send(broken);
  EXPECT_EQ(result.status, send_status::invalid_message);
  EXPECT_FALSE(result.detail.empty());
}

// Inproc delivers the sender's own buffer; its owner must live until the receiver lets go.
TEST(EndpointTest, PayloadOwnerIsReleasedOnlyAfterZeroMQIsDone) {
  transport_context context;
  std::optional<inbox> in = inbox::bind(context, "inproc://zero-copy");
  std::optional<outbox> out = outbox::connect(context, "inproc://zero-copy");
  ASSERT_TRUE(in && out);
  auto released = std::make_shared<std::atomic<bool>>(false);
  auto* values = new std::vector<float>(1024, 2.5f);
  const void* original_data = values->data();
  std::shared_ptr<const std::vector<float>> owner(values, [released](const std::vector<float>* v) {
    delete v;
    released->store(true);
  });
  message outgoing;
  add_payload(outgoing, {1024}, std::move(owner));
  ASSERT_TRUE(out->send(outgoing).ok());
  outgoing = message{};
  EXPECT_FALSE(released->load()) << "released while ZeroMQ still queues the payload";

  std::optional<decode_result> received = in->receive(10s);
  ASSERT_TRUE(received && received->ok());
  EXPECT_EQ(received->value->payloads[0].data, original_data) << "payload was copied";
  EXPECT_FALSE(released->load()) << "released while the receiver holds the payload";
  received.reset();
  EXPECT_TRUE(eventually([&] { return released->load(); }));
}

TEST(EndpointTest, QueuedPayloadIsReleasedWhenEndpointsClose) {
  auto released = std::make_shared<std::atomic<bool>>(false);
  {
    transport_context context;
    std::optional<inbox> in = inbox::bind(context, "inproc://never-read");
    std::optional<outbox> out = outbox::connect(context, "inproc://never-read");
    ASSERT_TRUE(in && out);
    std::shared_ptr<const std::vector<float>> owner(new std::vector<float>(16, 1.0f),
                                                    [released](const std::vector<float>* v) {
                                                      delete v;
                                                      released->store(true);
                                                    });
    message outgoing;
    add_payload(outgoing, {16}, std::move(owner));
    ASSERT_TRUE(out->send(outgoing).ok());
  }
  EXPECT_TRUE(eventually([&] { return released->load(); }));
}

TEST(EndpointTest, HighWaterMarkMakesSendReportWouldBlock) {
  transport_context context;
  endpoint_options options;
  options.send_high_water_mark = 2;
  options.receive_high_water_mark = 2;
  std::optional<inbox> in = inbox::bind(context, "inproc://bounded", options);
  std::optional<outbox> out = outbox::connect(context, "inproc://bounded", options);
  ASSERT_TRUE(in && out);
  int sent = 0;
  send_result last;
  while (sent < 1000 && (last = out->send(tensor_message(sent))).ok()) ++sent;
  EXPECT_EQ(last.status, send_status::would_block) << last.detail;
  EXPECT_GE(sent, 2);
  EXPECT_LE(sent, options.send_high_water_mark + options.receive_high_water_mark)
      << "the queue grew past the high-water marks";

  for (int key = 0; key < sent; ++key) {
    std::optional<decode_result> received = in->receive(10s);
    ASSERT_TRUE(received && received->ok());
    EXPECT_EQ(received->value->header.key, static_cast<uint64_t>(key));
  }
  EXPECT_TRUE(out->wait_writable(10s));
  EXPECT_TRUE(out->send(tensor_message(sent)).ok());
}

// One inproc sender delivers in order; garbage from a raw tcp peer is counted and skipped.
TEST(EndpointTest, ReceiverThreadDeliversInOrderAndCountsGarbage) {
  transport_context context;
  std::optional<inbox> local = inbox::bind(context, "inproc://receiver-test");
  std::optional<inbox> network = inbox::bind(context, "tcp://127.0.0.1:*");
  ASSERT_TRUE(local && network);
  const std::string network_address = network->address();
  std::optional<outbox> out = outbox::connect(context, "inproc://receiver-test");
  std::optional<outbox> network_out = outbox::connect(context, network_address);
  ASSERT_TRUE(out && network_out);

  collector seen;
  std::vector<inbox> inboxes;
  inboxes.push_back(std::move(*local));
  inboxes.push_back(std::move(*network));
  receiver_thread receiver(
      context, std::move(inboxes), [&](message&& received) { seen.add(std::move(received)); },
      [&](const std::string& address, const decode_error& error) { seen.drop(address, error); });

  constexpr uint64_t count = 200;
  for (uint64_t key = 0; key < count; ++key) {
    if (key == count / 2) {
      zmq::context_t raw_context;
      zmq::socket_t raw(raw_context, zmq::socket_type::push);
      raw.set(zmq::sockopt::linger, 0);
      raw.connect(network_address);
      ASSERT_TRUE(raw.send(zmq::str_buffer("not a troupe header"), zmq::send_flags::none));
      ASSERT_TRUE(seen.wait_for(key, 1)) << "garbage frame was not reported";
    }
    while (!out->send(tensor_message(key)).ok()) ASSERT_TRUE(out->wait_writable(10s));
  }
  ASSERT_TRUE(network_out->send(tensor_message(count)).ok());
  ASSERT_TRUE(seen.wait_for(count + 1, 1));
  receiver.stop();

  EXPECT_EQ(receiver.delivered(), count + 1);
  EXPECT_EQ(receiver.dropped(), 1u);
  EXPECT_EQ(seen.drops[0].reason, decode_error_reason::garbage);
  EXPECT_EQ(seen.drops[0].peer, "127.0.0.1");  // the sender, not the inbox
  uint64_t next_key = 0;
  for (const message& received : seen.messages) {
    if (received.header.key == count) continue;  // the tcp message, unordered against inproc
    EXPECT_EQ(received.header.key, next_key++);
  }
  EXPECT_EQ(next_key, count);
  expect_tensor_message(seen.messages.back(), seen.messages.back().header.key);
}

TEST(EndpointTest, InboxReportsFrameCountMismatchFromARawPeer) {
  transport_context context;
  std::optional<inbox> in = inbox::bind(context, "tcp://127.0.0.1:*");
  ASSERT_TRUE(in);
  message_header header;
  for (int i = 0; i < 10; ++i) header.frames.push_back({element_type::float32, {1}});
  const std::vector<uint8_t> header_bytes = encode_header(header);

  zmq::context_t raw_context;
  zmq::socket_t raw(raw_context, zmq::socket_type::push);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(in->address());
  raw.send(zmq::buffer(header_bytes), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("abcd"), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("efgh"), zmq::send_flags::none);

  std::optional<decode_result> received = in->receive(10s);
  ASSERT_TRUE(received);
  ASSERT_FALSE(received->ok());
  EXPECT_EQ(received->error.reason, decode_error_reason::frame_count_mismatch);
}

}  // namespace
}  // namespace troupe::transport
