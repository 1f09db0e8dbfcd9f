#include "transport/codec.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace troupe::transport {
namespace {

message_header sample_header() {
  message_header header;
  header.kind = message_kind::forward;
  header.job_id = 0x1234'5678'9abc'def0;
  header.key = 42;
  header.source_stage = 1;
  header.target_stage = 2;
  header.weight_version = 7;
  header.step = -3;
  header.sample_offset = 640;
  header.frames.push_back(tensor_frame_info{element_type::float32, {2, 3}});
  header.frames.push_back(tensor_frame_info{element_type::int32, {2}});
  header.metrics = {{"loss", 0.25}, {"samples", 64}};
  return header;
}

message sample_message() {
  message result;
  result.header = sample_header();
  result.header.frames.clear();
  add_payload(result, {2, 3},
              std::make_shared<const std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6}));
  add_payload(result, {2},
              std::make_shared<const std::vector<int32_t>>(std::vector<int32_t>{7, 9}));
  return result;
}

decode_result decode(const std::vector<uint8_t>& header_bytes, std::vector<frame> payloads,
                     const decode_limits& limits = decode_limits{}) {
  return decode_message(header_bytes.data(), header_bytes.size(), std::move(payloads), limits);
}

decode_error_reason reason_of(const decode_result& result) {
  EXPECT_FALSE(result.ok());
  return result.error.reason;
}

TEST(CodecTest, HeaderRoundTrip) {
  const message_header header = sample_header();
  const std::vector<uint8_t> bytes = encode_header(header);
  decoded<message_header> result = decode_header(bytes.data(), bytes.size());
  ASSERT_TRUE(result.ok()) << result.error.text;
  EXPECT_EQ(*result.value, header);
  EXPECT_EQ(0, std::memcmp(bytes.data(), "TRPH", 4));
}

TEST(CodecTest, ControlTextRoundTripsAndIsBounded) {
  message_header header = sample_header();
  header.text = R"({"training": {"lr": 0.05}})";
  std::vector<uint8_t> bytes = encode_header(header);
  decoded<message_header> result = decode_header(bytes.data(), bytes.size());
  ASSERT_TRUE(result.ok()) << result.error.text;
  EXPECT_EQ(result.value->text, header.text);
  header.text.assign(decode_limits{}.max_text_bytes + 1, 'x');
  EXPECT_TRUE(validate_header(header, decode_limits{}).has_value());
  bytes = encode_header(header);
  result = decode_header(bytes.data(), bytes.size());
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error.reason, decode_error_reason::oversized);
}

TEST(CodecTest, MessageRoundTripKeepsPayloadsInPlace) {
  message original = sample_message();
  const void* float_data = original.payloads[0].data;
  decode_result result = decode(encode_header(original.header), original.payloads);
  ASSERT_TRUE(result.ok()) << result.error.text;
  EXPECT_EQ(result.value->header, original.header);
  ASSERT_EQ(result.value->payloads.size(), 2u);
  EXPECT_EQ(result.value->payloads[0].data, float_data);
  EXPECT_EQ(result.value->payloads[1].bytes, 2 * sizeof(int32_t));
}

TEST(CodecTest, EmptyPayloadListAndZeroSizedTensorAreValid) {
  message_header control;
  EXPECT_TRUE(decode(encode_header(control), {}).ok());
  message_header empty_batch;
  empty_batch.frames.push_back(tensor_frame_info{element_type::float32, {0, 10}});
  EXPECT_TRUE(decode(encode_header(empty_batch), {frame{}}).ok());
}

TEST(CodecTest, RejectsEveryTruncationOfTheHeader) {
  const std::vector<uint8_t> bytes = encode_header(sample_header());
  for (size_t length = 0; length < bytes.size(); ++length) {
    decoded<message_header> result = decode_header(bytes.data(), length);
    ASSERT_FALSE(result.ok()) << length;
    EXPECT_EQ(result.error.reason, decode_error_reason::truncated) << length;
  }
}

TEST(CodecTest, RejectsTrailingBytesAsGarbage) {
  std::vector<uint8_t> bytes = encode_header(sample_header());
  bytes.push_back(0);
  EXPECT_EQ(decode_header(bytes.data(), bytes.size()).error.reason, decode_error_reason::garbage);
}

TEST(CodecTest, RejectsFrameCountMismatch) {
  message_header header;
  for (int i = 0; i < 10; ++i) header.frames.push_back({element_type::float32, {1}});
  std::vector<frame> two = {copy_frame("abcd", 4), copy_frame("efgh", 4)};
  decode_result result = decode(encode_header(header), two);
  EXPECT_EQ(reason_of(result), decode_error_reason::frame_count_mismatch);
  EXPECT_NE(result.error.text.find("10"), std::string::npos) << result.error.text;
}

TEST(CodecTest, RejectsNegativeAndOverflowingDims) {
  message_header negative;
  negative.frames.push_back({element_type::float32, {4, -1}});
  EXPECT_EQ(reason_of(decode(encode_header(negative), {frame{}})), decode_error_reason::bad_shape);

  message_header overflowing;
  const int64_t huge = int64_t{1} << 40;
  overflowing.frames.push_back({element_type::float32, {huge, huge}});
  EXPECT_EQ(reason_of(decode(encode_header(overflowing), {frame{}})),
            decode_error_reason::bad_shape);

  message_header bytes_overflow;  // the element count fits; times 4 bytes it does not
  bytes_overflow.frames.push_back({element_type::int32, {int64_t{1} << 62}});
  EXPECT_EQ(reason_of(decode(encode_header(bytes_overflow), {frame{}})),
            decode_error_reason::bad_shape);
}

TEST(CodecTest, RejectsTooManyDims) {
  message_header header;
  header.frames.push_back({element_type::float32, std::vector<int64_t>(9, 1)});
  EXPECT_EQ(reason_of(decode(encode_header(header), {copy_frame("abcd", 4)})),
            decode_error_reason::bad_shape);
}

TEST(CodecTest, RejectsPayloadSizeMismatch) {
  message original = sample_message();
  original.payloads[0].bytes -= 4;
  EXPECT_EQ(reason_of(decode(encode_header(original.header), original.payloads)),
            decode_error_reason::payload_size_mismatch);
}

TEST(CodecTest, RejectsOversizedHeaderAndPayloads) {
  std::vector<uint8_t> big(70 * 1024, 0);
  std::memcpy(big.data(), "TRPH", 4);
  EXPECT_EQ(decode_header(big.data(), big.size()).error.reason, decode_error_reason::oversized);

  message original = sample_message();  // 24 + 8 payload bytes
  decode_limits small;
  small.max_payload_bytes = 30;
  EXPECT_EQ(reason_of(decode(encode_header(original.header), original.payloads, small)),
            decode_error_reason::oversized);

  message_header many_frames;
  for (int i = 0; i < 65; ++i) many_frames.frames.push_back({element_type::float32, {0}});
  EXPECT_EQ(reason_of(decode(encode_header(many_frames), {})), decode_error_reason::oversized);
}

TEST(CodecTest, RejectsUnknownVersion) {
  message_header header = sample_header();
  header.protocol_version = 99;
  const std::vector<uint8_t> bytes = encode_header(header);
  decoded<message_header> result = decode_header(bytes.data(), bytes.size());
  EXPECT_EQ(result.error.reason, decode_error_reason::unknown_version);
  EXPECT_NE(result.error.text.find("99"), std::string::npos) << result.error.text;
}

TEST(CodecTest, RejectsUnknownKindAndDtype) {
  message_header header;
  header.kind = static_cast<message_kind>(message_kind_count);
  std::vector<uint8_t> bytes = encode_header(header);
  EXPECT_EQ(decode_header(bytes.data(), bytes.size()).error.reason, decode_error_reason::garbage);

  message_header dtype;
  dtype.frames.push_back({static_cast<element_type>(element_type_count), {1}});
  bytes = encode_header(dtype);
  EXPECT_EQ(decode_header(bytes.data(), bytes.size()).error.reason, decode_error_reason::garbage);
}

TEST(CodecTest, ValidateMessageChecksWhatASenderWouldSend) {
  EXPECT_FALSE(validate_message(sample_message()).has_value());
  message broken = sample_message();
  broken.payloads.pop_back();
  EXPECT_EQ(validate_message(broken)->reason, decode_error_reason::frame_count_mismatch);
}

TEST(CodecTest, MisalignedPayloadIsCopiedToAlignedMemory) {
  auto buffer = std::make_shared<std::vector<uint8_t>>(4 * 6 + 1);
  const float values[6] = {1, 2, 3, 4, 5, 6};
  std::memcpy(buffer->data() + 1, values, sizeof values);
  message_header header;
  header.frames.push_back({element_type::float32, {6}});
  frame misaligned{buffer, buffer->data() + 1, sizeof values};
  decode_result result = decode(encode_header(header), {misaligned});
  ASSERT_TRUE(result.ok()) << result.error.text;
  const frame& payload = result.value->payloads[0];
  EXPECT_EQ(reinterpret_cast<uintptr_t>(payload.data) % alignof(float), 0u);
  EXPECT_EQ(0, std::memcmp(payload.data, values, sizeof values));
}

TEST(CodecTest, RandomBytesAreRejected) {
  std::mt19937_64 random(20240611);
  for (int trial = 0; trial < 5000; ++trial) {
    std::vector<uint8_t> bytes(random() % 200);
    for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(random());
    if (trial % 2 == 0 && bytes.size() >= 4) std::memcpy(bytes.data(), "TRPH", 4);
    decoded<message_header> result = decode_header(bytes.data(), bytes.size());
    EXPECT_FALSE(result.ok()) << "trial " << trial;
    EXPECT_FALSE(result.error.text.empty());
  }
}

// A mutated message is either rejected or decoded into something that encodes and decodes again
// to the same bytes, with payloads that match the decoded shapes.
void check_mutation(const std::vector<uint8_t>& bytes, std::vector<frame> payloads) {
  decode_result result = decode(bytes, std::move(payloads));
  if (!result.ok()) {
    EXPECT_FALSE(result.error.text.empty());
    return;
  }
  EXPECT_FALSE(validate_payloads(result.value->header, result.value->payloads).has_value());
  const std::vector<uint8_t> again = encode_header(result.value->header);
  decoded<message_header> second = decode_header(again.data(), again.size());
  ASSERT_TRUE(second.ok()) << second.error.text;
  EXPECT_EQ(encode_header(*second.value), again);
}

TEST(CodecTest, RandomMutationsOfAValidMessageNeverCrash) {
  const message original = sample_message();
  const std::vector<uint8_t> valid = encode_header(original.header);
  std::mt19937_64 random(7);
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<uint8_t> bytes = valid;
    const int edits = 1 + static_cast<int>(random() % 4);
    for (int edit = 0; edit < edits; ++edit) {
      const size_t at = random() % bytes.size();
      if (random() % 4 == 0) {
        bytes[at] ^= static_cast<uint8_t>(1u << (random() % 8));
      } else {
        bytes[at] = static_cast<uint8_t>(random());
      }
    }
    if (random() % 8 == 0) bytes.resize(random() % (bytes.size() + 8));
    std::vector<frame> payloads = original.payloads;
    if (random() % 8 == 0) payloads.pop_back();
    if (random() % 8 == 0) payloads[0].bytes = random() % (payloads[0].bytes + 1);
    check_mutation(bytes, payloads);
    accepted += decode(bytes, payloads).ok() ? 1 : 0;
  }
  EXPECT_GT(accepted, 0);  // some mutations (of ids and metric values) stay valid
}

}  // namespace
}  // namespace troupe::transport
