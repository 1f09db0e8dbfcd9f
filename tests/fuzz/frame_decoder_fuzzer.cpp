// libFuzzer target for the frame decoder (transport/codec.h): no byte sequence may crash it, and
// whatever it accepts must survive encode_header -> decode_message unchanged.
//
// One fuzzer input describes one received message:
//
//   byte 0        flags: bits 0-3 payload frame count (0..15), bit 4 payloads point into the input
//                 (often misaligned, with no owner) instead of being copied, bit 5 tight limits
//   2 bytes       header frame length, little-endian, cut to what the input still holds
//   ...           header frame
//   per payload   2-byte little-endian length, cut to what remains, then the payload bytes
//
// A frame the input runs out for is empty. Every frame gets its own exactly-sized buffer unless
// bit 4 asks otherwise, so that AddressSanitizer sees any read past a frame's end.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "transport/codec.h"

namespace troupe::transport {
namespace {

// Cuts the input into length-prefixed pieces; never reads past its end.
class input_reader {
 public:
  input_reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t byte() { return size_ > 0 ? (--size_, *data_++) : 0; }

  // The next length-prefixed piece as [start, start + length); length is cut to what is left.
  const uint8_t* piece(size_t& length) {
    const size_t low = byte();
    length = std::min(low | size_t{byte()} << 8, size_);
    const uint8_t* start = data_;
    data_ += length;
    size_ -= length;
    return start;
  }

 private:
  const uint8_t* data_;
  size_t size_;
};

void fail(const char* what) {
  std::fprintf(stderr, "frame_decoder_fuzzer: %s\n", what);
  std::abort();
}

void check(bool condition, const char* what) {
  if (!condition) fail(what);
}

decode_limits tight_limits() {
  decode_limits limits;
  limits.max_header_bytes = 512;
  limits.max_payload_bytes = 256;
  limits.max_frames = 4;
  limits.max_dims = 3;
  limits.max_metrics = 3;
  limits.max_metric_name_bytes = 8;
  limits.max_text_bytes = 16;
  return limits;
}

// NaN metrics never compare equal (see operator==), so they are replaced by a marker first;
// encode_header's bytes still compare them bit for bit.
message_header without_nan(message_header header) {
  for (auto& entry : header.metrics) {
    if (std::isnan(entry.second)) entry.second = -0.125;
  }
  return header;
}

// Checks what decode_message promises about the payloads of a message it accepted.
void check_payloads(const message& decoded, const std::vector<frame>& received) {
  check(decoded.payloads.size() == decoded.header.frames.size(), "payload count differs");
  check(decoded.payloads.size() == received.size(), "payloads were added or dropped");
  for (size_t i = 0; i < received.size(); ++i) {
    const frame& payload = decoded.payloads[i];
    const size_t alignment = element_size(decoded.header.frames[i].dtype);
    check(payload.bytes == received[i].bytes, "payload size changed");
    check(reinterpret_cast<uintptr_t>(payload.data) % alignment == 0, "payload left misaligned");
    check(payload.bytes == 0 || std::memcmp(payload.data, received[i].data, payload.bytes) == 0,
          "payload bytes changed");
  }
}

// An accepted header must encode to a frame that decodes to the same header and bytes.
void check_round_trip(const message& decoded, const decode_limits& limits) {
  check(!validate_message(decoded, limits).has_value(), "accepted message fails validate_message");
  const std::vector<uint8_t> encoded = encode_header(decoded.header);
  decode_result again = decode_message(encoded.data(), encoded.size(), decoded.payloads, limits);
  if (!again.ok()) {
    std::fprintf(stderr, "re-decoding failed: %s: %s\n", to_string(again.error.reason),
                 again.error.text.c_str());
    fail("re-encoded header is rejected");
  }
  check(without_nan(again.value->header) == without_nan(decoded.header),
        "round trip changed the header");
  check(encode_header(again.value->header) == encoded, "re-encoding is not stable");
}

}  // namespace
}  // namespace troupe::transport

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe::transport;
  input_reader input(data, size);
  const uint8_t flags = input.byte();
  const size_t payload_count = flags & 0x0f;
  const bool in_place = (flags & 0x10) != 0;
  const decode_limits limits = (flags & 0x20) != 0 ? tight_limits() : decode_limits{};

  size_t header_bytes = 0;
  const uint8_t* header_start = input.piece(header_bytes);
  const std::vector<uint8_t> header(header_start, header_start + header_bytes);
  std::vector<frame> payloads;
  for (size_t i = 0; i < payload_count; ++i) {
    size_t bytes = 0;
    const uint8_t* start = input.piece(bytes);
    payloads.push_back(in_place ? frame{nullptr, start, bytes} : copy_frame(start, bytes));
  }

  const decoded<message_header> alone = decode_header(header.data(), header.size(), limits);
  const decode_result result = decode_message(header.data(), header.size(), payloads, limits);
  if (!alone.ok()) {
    check(!result.ok() && result.error.reason == alone.error.reason,
          "decode_message and decode_header disagree on a bad header");
  }
  if (!result.ok()) {
    check(!result.error.text.empty(), "rejection without a message");
    check(std::strcmp(to_string(result.error.reason), "unknown") != 0, "unnamed reason");
    return 0;
  }
  check(alone.ok() && without_nan(*alone.value) == without_nan(result.value->header),
        "decode_message and decode_header disagree on a good header");
  check_payloads(*result.value, payloads);
  check_round_trip(*result.value, limits);
  return 0;
}
