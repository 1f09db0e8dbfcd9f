#include "transport/codec.h"

#include <cstring>
#include <exception>
#include <istream>
#include <sstream>
#include <streambuf>
#include <utility>

#include <cereal/archives/portable_binary.hpp>

namespace troupe::transport {
namespace {

constexpr char header_magic[4] = {'T', 'R', 'P', 'H'};
constexpr size_t preamble_bytes = 10;

using output_archive = cereal::PortableBinaryOutputArchive;
using input_archive = cereal::PortableBinaryInputArchive;

decode_error make_error(decode_error_reason reason, std::string text) {
  return decode_error{reason, std::move(text), {}};
}

// A std::streambuf that reads a caller's bytes in place, so parsing never copies the frame.
class byte_reader : public std::streambuf {
 public:
  byte_reader(const uint8_t* data, size_t bytes) {
    char* begin = reinterpret_cast<char*>(const_cast<uint8_t*>(data));
    setg(begin, begin, begin + bytes);
  }
  size_t remaining() const { return static_cast<size_t>(egptr() - gptr()); }
};

void put_little_endian(std::vector<uint8_t>& out, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}

uint64_t get_little_endian(const uint8_t* in, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

std::string shape_text(const tensor_frame_info& info) {
  std::string text = std::string(to_string(info.dtype)) + " [";
  for (size_t i = 0; i < info.dims.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(info.dims[i]);
  }
  return text + "]";
}

void write_body(output_archive& archive, const message_header& header) {
  archive(static_cast<uint8_t>(header.kind), header.job_id, header.key, header.source_stage,
          header.target_stage, header.weight_version, header.step, header.sample_offset);
  archive(static_cast<uint32_t>(header.frames.size()));
  for (const tensor_frame_info& info : header.frames) {
    archive(static_cast<uint8_t>(info.dtype), static_cast<uint32_t>(info.dims.size()));
    for (int64_t dim : info.dims) archive(dim);
  }
  archive(static_cast<uint32_t>(header.metrics.size()));
  for (const auto& [name, value] : header.metrics) {
    archive(static_cast<uint32_t>(name.size()));
    archive(cereal::binary_data(name.data(), name.size()));
    archive(value);
  }
  archive(static_cast<uint32_t>(header.text.size()));
  archive(cereal::binary_data(header.text.data(), header.text.size()));
}

// Each count is checked against its limit before the container it sizes is grown.
std::optional<decode_error> read_frames(input_archive& archive, const decode_limits& limits,
                                        std::vector<tensor_frame_info>& frames) {
  uint32_t count = 0;
  archive(count);
  if (count > limits.max_frames) {
    return make_error(decode_error_reason::oversized, "header announces " + std::to_string(count) +
                                                          " payload frames; the limit is " +
                                                          std::to_string(limits.max_frames));
  }
  frames.resize(count);
  for (size_t i = 0; i < frames.size(); ++i) {
    uint8_t dtype = 0;
    uint32_t dims = 0;
    archive(dtype, dims);
    if (dtype >= element_type_count) {
      return make_error(
          decode_error_reason::garbage,
          "payload " + std::to_string(i) + " has unknown dtype " + std::to_string(dtype));
    }
    if (dims > limits.max_dims) {
      return make_error(decode_error_reason::bad_shape,
                        "payload " + std::to_string(i) + " has " + std::to_string(dims) +
                            " dimensions; the limit is " + std::to_string(limits.max_dims));
    }
    frames[i].dtype = static_cast<element_type>(dtype);
    frames[i].dims.resize(dims);
    for (int64_t& dim : frames[i].dims) archive(dim);
  }
  return std::nullopt;
}

std::optional<decode_error> read_metrics(input_archive& archive, const decode_limits& limits,
                                         std::map<std::string, double>& metrics) {
  uint32_t count = 0;
  archive(count);
  if (count > limits.max_metrics) {
    return make_error(decode_error_reason::oversized, "header carries " + std::to_string(count) +
                                                          " metrics; the limit is " +
                                                          std::to_string(limits.max_metrics));
  }
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t length = 0;
    archive(length);
    if (length > limits.max_metric_name_bytes) {
      return make_error(decode_error_reason::oversized,
                        "metric name of " + std::to_string(length) + " bytes; the limit is " +
                            std::to_string(limits.max_metric_name_bytes));
    }
    std::string name(length, '\0');
    archive(cereal::binary_data(name.data(), name.size()));
    double value = 0;
    archive(value);
    if (!metrics.emplace(std::move(name), value).second) {
      return make_error(decode_error_reason::garbage, "metric name repeated in header");
    }
  }
  return std::nullopt;
}

std::optional<decode_error> read_body(input_archive& archive, const decode_limits& limits,
                                      message_header& header) {
  uint8_t kind = 0;
  archive(kind, header.job_id, header.key, header.source_stage, header.target_stage,
          header.weight_version, header.step, header.sample_offset);
  if (kind >= message_kind_count) {
    return make_error(decode_error_reason::garbage, "unknown message kind " + std::to_string(kind));
  }
  header.kind = static_cast<message_kind>(kind);
  if (auto failure = read_frames(archive, limits, header.frames)) return failure;
  if (auto failure = read_metrics(archive, limits, header.metrics)) return failure;
  uint32_t length = 0;
  archive(length);
  if (length > limits.max_text_bytes) {
    return make_error(decode_error_reason::oversized, "text of " + std::to_string(length) +
                                                          " bytes; the limit is " +
                                                          std::to_string(limits.max_text_bytes));
  }
  header.text.assign(length, '\0');
  archive(cereal::binary_data(header.text.data(), header.text.size()));
  return std::nullopt;
}

// Cereal reports a read past the end of the body by throwing; that becomes `garbage` here
// because the preamble already vouched for the body's length.
std::optional<decode_error> parse_body(const uint8_t* data, size_t bytes,
                                       const decode_limits& limits, message_header& header) {
  byte_reader reader(data, bytes);
  std::istream stream(&reader);
  try {
    input_archive archive(stream);
    if (auto failure = read_body(archive, limits, header)) return failure;
  } catch (const std::exception& exception) {
    return make_error(decode_error_reason::garbage,
                      std::string("header body does not parse: ") + exception.what());
  }
  if (reader.remaining() != 0) {
    return make_error(decode_error_reason::garbage,
                      std::to_string(reader.remaining()) + " unread bytes after the header fields");
  }
  return std::nullopt;
}

// Bytes of the payload `info` describes, or why the shape is unusable.
std::optional<decode_error> payload_bytes(const tensor_frame_info& info, size_t index,
                                          uint64_t& bytes) {
  const std::string name = "payload " + std::to_string(index);
  if (static_cast<uint8_t>(info.dtype) >= element_type_count) {
    return make_error(decode_error_reason::garbage, name + " has an unknown dtype");
  }
  uint64_t count = 1;
  for (int64_t dim : info.dims) {
    if (dim < 0) {
      return make_error(decode_error_reason::bad_shape,
                        name + " has a negative dimension: " + shape_text(info));
    }
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dim), &count)) {
      return make_error(decode_error_reason::bad_shape,
                        name + " element count overflows 64 bits: " + shape_text(info));
    }
  }
  if (__builtin_mul_overflow(count, uint64_t{element_size(info.dtype)}, &bytes)) {
    return make_error(decode_error_reason::bad_shape,
                      name + " byte count overflows 64 bits: " + shape_text(info));
  }
  return std::nullopt;
}

std::optional<decode_error> validate_metrics(const std::map<std::string, double>& metrics,
                                             const decode_limits& limits) {
  if (metrics.size() > limits.max_metrics) {
    return make_error(decode_error_reason::oversized, std::to_string(metrics.size()) +
                                                          " metrics; the limit is " +
                                                          std::to_string(limits.max_metrics));
  }
  for (const auto& entry : metrics) {
    if (entry.first.size() > limits.max_metric_name_bytes) {
      return make_error(decode_error_reason::oversized,
                        "metric name '" + entry.first.substr(0, 32) + "...' is too long");
    }
  }
  return std::nullopt;
}

// Checks the fixed-layout start of a header frame, so that nothing of a frame that is cut off,
// foreign or too large is parsed.
std::optional<decode_error> check_preamble(const uint8_t* in, size_t bytes,
                                           const decode_limits& limits) {
  using reason = decode_error_reason;
  if (bytes > limits.max_header_bytes) {
    return make_error(reason::oversized, "header frame of " + std::to_string(bytes) +
                                             " bytes; the limit is " +
                                             std::to_string(limits.max_header_bytes));
  }
  if (bytes < preamble_bytes) {
    return make_error(reason::truncated, "header frame of " + std::to_string(bytes) +
                                             " bytes is shorter than its 10-byte preamble");
  }
  if (std::memcmp(in, header_magic, sizeof header_magic) != 0) {
    return make_error(reason::garbage, "header frame does not start with \"TRPH\"");
  }
  const uint64_t version = get_little_endian(in + 4, 2);
  if (version != current_protocol_version) {
    return make_error(reason::unknown_version, "protocol version " + std::to_string(version) +
                                                   "; this build reads version " +
                                                   std::to_string(current_protocol_version));
  }
  const uint64_t body = get_little_endian(in + 6, 4);
  const size_t present = bytes - preamble_bytes;
  if (body > present) {
    return make_error(reason::truncated, "header body declares " + std::to_string(body) +
                                             " bytes; " + std::to_string(present) + " arrived");
  }
  if (body < present) {
    return make_error(reason::garbage,
                      std::to_string(present - body) + " bytes follow the header body");
  }
  return std::nullopt;
}

// Moves a payload whose address is not a multiple of its element size into an aligned copy (an
// empty payload becomes frame{}, whose null address is aligned).
void align_payload(const tensor_frame_info& info, frame& payload) {
  auto address = reinterpret_cast<uintptr_t>(payload.data);
  if (address % element_size(info.dtype) != 0) {
    payload = copy_frame(payload.data, payload.bytes);
  }
}

}  // namespace

const char* to_string(decode_error_reason reason) {
  switch (reason) {
    case decode_error_reason::truncated:
      return "truncated";
    case decode_error_reason::oversized:
      return "oversized";
    case decode_error_reason::unknown_version:
      return "unknown_version";
    case decode_error_reason::garbage:
      return "garbage";
    case decode_error_reason::bad_shape:
      return "bad_shape";
    case decode_error_reason::frame_count_mismatch:
      return "frame_count_mismatch";
    case decode_error_reason::payload_size_mismatch:
      return "payload_size_mismatch";
  }
  return "unknown";
}

std::vector<uint8_t> encode_header(const message_header& header) {
  std::ostringstream body(std::ios::binary);
  {
    output_archive archive(body);
    write_body(archive, header);
  }
  const std::string body_bytes = body.str();
  std::vector<uint8_t> out(std::begin(header_magic), std::end(header_magic));
  out.reserve(preamble_bytes + body_bytes.size());
  put_little_endian(out, header.protocol_version, 2);
  put_little_endian(out, body_bytes.size(), 4);
  out.insert(out.end(), body_bytes.begin(), body_bytes.end());
  return out;
}

decoded<message_header> decode_header(const void* data, size_t bytes, const decode_limits& limits) {
  const auto* in = static_cast<const uint8_t*>(data);
  message_header header;
  std::optional<decode_error> failure = check_preamble(in, bytes, limits);
  if (!failure) {
    header.protocol_version = static_cast<uint16_t>(get_little_endian(in + 4, 2));
    failure = parse_body(in + preamble_bytes, bytes - preamble_bytes, limits, header);
  }
  if (!failure) failure = validate_header(header, limits);
  if (failure) return {std::nullopt, std::move(*failure)};
  return {std::move(header), {}};
}

std::optional<decode_error> validate_header(const message_header& header,
                                            const decode_limits& limits) {
  if (header.protocol_version != current_protocol_version) {
    return make_error(decode_error_reason::unknown_version,
                      "protocol version " + std::to_string(header.protocol_version));
  }
  if (static_cast<uint8_t>(header.kind) >= message_kind_count) {
    return make_error(decode_error_reason::garbage, "unknown message kind");
  }
  if (header.frames.size() > limits.max_frames) {
    return make_error(decode_error_reason::oversized, std::to_string(header.frames.size()) +
                                                          " payload frames; the limit is " +
                                                          std::to_string(limits.max_frames));
  }
  uint64_t total = 0;
  for (size_t i = 0; i < header.frames.size(); ++i) {
    if (header.frames[i].dims.size() > limits.max_dims) {
      return make_error(decode_error_reason::bad_shape,
                        "payload " + std::to_string(i) +
                            " has too many dimensions: " + shape_text(header.frames[i]));
    }
    uint64_t bytes = 0;
    if (auto failure = payload_bytes(header.frames[i], i, bytes)) return failure;
    if (bytes > limits.max_payload_bytes - total) {
      return make_error(decode_error_reason::oversized,
                        "payloads exceed the limit of " + std::to_string(limits.max_payload_bytes) +
                            " bytes at payload " + std::to_string(i) + ": " +
                            shape_text(header.frames[i]));
    }
    total += bytes;
  }
  if (header.text.size() > limits.max_text_bytes) {
    return make_error(decode_error_reason::oversized,
                      "text of " + std::to_string(header.text.size()) + " bytes; the limit is " +
                          std::to_string(limits.max_text_bytes));
  }
  return validate_metrics(header.metrics, limits);
}

std::optional<decode_error> validate_payloads(const message_header& header,
                                              const std::vector<frame>& payloads) {
  if (payloads.size() != header.frames.size()) {
    return make_error(decode_error_reason::frame_count_mismatch,
                      "header announces " + std::to_string(header.frames.size()) +
                          " payload frames; " + std::to_string(payloads.size()) + " arrived");
  }
  for (size_t i = 0; i < payloads.size(); ++i) {
    uint64_t expected = 0;
    if (auto failure = payload_bytes(header.frames[i], i, expected)) return failure;
    if (payloads[i].bytes != expected || (expected != 0 && payloads[i].data == nullptr)) {
      return make_error(decode_error_reason::payload_size_mismatch,
                        "payload " + std::to_string(i) + " (" + shape_text(header.frames[i]) +
                            ") should be " + std::to_string(expected) + " bytes; it is " +
                            std::to_string(payloads[i].bytes));
    }
  }
  return std::nullopt;
}

std::optional<decode_error> validate_message(const message& outgoing, const decode_limits& limits) {
  if (auto failure = validate_header(outgoing.header, limits)) return failure;
  return validate_payloads(outgoing.header, outgoing.payloads);
}

decode_result decode_message(const void* header_data, size_t header_bytes,
                             std::vector<frame> payloads, const decode_limits& limits) {
  decoded<message_header> header = decode_header(header_data, header_bytes, limits);
  if (!header.ok()) return {std::nullopt, std::move(header.error)};
  if (auto failure = validate_payloads(*header.value, payloads)) {
    return {std::nullopt, std::move(*failure)};
  }
  for (size_t i = 0; i < payloads.size(); ++i) align_payload(header.value->frames[i], payloads[i]);
  return {message{std::move(*header.value), std::move(payloads)}, {}};
}

}  // namespace troupe::transport
