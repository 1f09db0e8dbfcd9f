#pragma once

// The wire format. Frame 0 of a message is the header frame:
//
//   offset 0   4 bytes   magic "TRPH"
//   offset 4   uint16    protocol version, little-endian
//   offset 6   uint32    body length in bytes, little-endian
//   offset 10  body      Cereal portable-binary archive of the remaining header fields
//
// The fixed preamble lets a decoder reject a foreign version, or a cut-off frame, before it
// parses anything. Frames 1..N are the raw payload bytes, one per header.frames entry, in host
// (little-endian) byte order. Every function here is pure and may be called from any thread.
// Decoding validates each count and size against decode_limits before anything is allocated,
// and bad input is reported as a decode_error value: nothing throws out of this interface.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "transport/message.h"

namespace troupe::transport {

/// Why a frame sequence was rejected.
enum class decode_error_reason : uint8_t {
  truncated,              ///< the header frame ends before its declared length
  oversized,              ///< a size or count is above its decode_limits bound
  unknown_version,        ///< the preamble names a protocol version this build cannot read
  garbage,                ///< wrong magic, trailing bytes, bad enum value, unparseable body
  bad_shape,              ///< too many dims, a negative dim, or an element count that overflows
  frame_count_mismatch,   ///< the number of payload frames differs from header.frames
  payload_size_mismatch,  ///< a payload's byte count differs from its shape times element size
};

/// "truncated", "oversized", ... (the enumerator's name).
const char* to_string(decode_error_reason reason);

/// A rejected frame sequence: the reason class plus one line naming the offending field.
struct decode_error {
  decode_error_reason reason = decode_error_reason::garbage;
  std::string text;
  /// The sender's address when the transport knows it (tcp: its IP), else empty.
  std::string peer;
};

/// Bounds a decoder enforces (and an encoder checks before sending); all sizes in bytes.
struct decode_limits {
  /// Largest header frame accepted.
  size_t max_header_bytes = 64 * 1024;
  /// Largest sum of all payload frames of one message.
  uint64_t max_payload_bytes = uint64_t{1} << 30;
  /// Most payload frames per message.
  size_t max_frames = 64;
  /// Most dimensions per payload.
  size_t max_dims = 8;
  /// Most entries in message_header::metrics.
  size_t max_metrics = 64;
  /// Longest metric name.
  size_t max_metric_name_bytes = 128;
  /// Longest message_header::text accepted.
  size_t max_text_bytes = 48 * 1024;
};

/// A decoded value, or the reason it could not be decoded (exactly one of the two is meaningful).
template <class T>
struct decoded {
  std::optional<T> value;
  decode_error error;

  /// True when `value` holds a result.
  bool ok() const { return value.has_value(); }
};

/// A decoded message or the reason its frames were rejected.
using decode_result = decoded<message>;

/// Serializes `header` into a header frame; never fails (validity is checked by validate_*).
std::vector<uint8_t> encode_header(const message_header& header);

/// Parses and validates one header frame of `bytes` bytes at `data`.
decoded<message_header> decode_header(const void* data, size_t bytes,
                                      const decode_limits& limits = decode_limits{});

/// Checks the fields of a header: version, kind, dtypes, dims, total payload size, metrics.
std::optional<decode_error> validate_header(const message_header& header,
                                            const decode_limits& limits = decode_limits{});

/// Checks that `payloads` match `header.frames` in number and byte size; `header` must have
/// passed validate_header().
std::optional<decode_error> validate_payloads(const message_header& header,
                                              const std::vector<frame>& payloads);

/// Both checks on a message about to be sent.
std::optional<decode_error> validate_message(const message& outgoing,
                                             const decode_limits& limits = decode_limits{});

/// Decodes the header frame at `header_data` and pairs it with `payloads` after checking them.
/// A payload whose address is not aligned to its element size (possible for bytes received
/// over tcp) is replaced by an aligned copy; every other payload is passed through untouched.
decode_result decode_message(const void* header_data, size_t header_bytes,
                             std::vector<frame> payloads,
                             const decode_limits& limits = decode_limits{});

}  // namespace troupe::transport
