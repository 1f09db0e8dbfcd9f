#include "transport/message.h"

#include <cstring>
#include <utility>

namespace troupe::transport {

size_t element_size(element_type type) {
  switch (type) {
    case element_type::float32:
      return sizeof(float);
    case element_type::int32:
      return sizeof(int32_t);
    case element_type::bytes:
      return 1;
  }
  return 0;
}

const char* to_string(message_kind kind) {
  switch (kind) {
    case message_kind::forward:
      return "forward";
    case message_kind::backward:
      return "backward";
    case message_kind::evaluate:
      return "evaluate";
    case message_kind::loss_report:
      return "loss_report";
    case message_kind::control:
      return "control";
    case message_kind::save_state:
      return "save_state";
    case message_kind::load_state:
      return "load_state";
    case message_kind::stage_state:
      return "stage_state";
    case message_kind::load_weights:
      return "load_weights";
    case message_kind::state_loaded:
      return "state_loaded";
    case message_kind::state_refused:
      return "state_refused";
    case message_kind::key_retired:
      return "key_retired";
    case message_kind::optimizer_step:
      return "optimizer_step";
    case message_kind::gradient_chunk:
      return "gradient_chunk";
  }
  return "unknown";
}

const char* to_string(element_type type) {
  switch (type) {
    case element_type::float32:
      return "float32";
    case element_type::int32:
      return "int32";
    case element_type::bytes:
      return "bytes";
  }
  return "unknown";
}

bool operator==(const tensor_frame_info& left, const tensor_frame_info& right) {
  return left.dtype == right.dtype && left.dims == right.dims;
}

bool operator!=(const tensor_frame_info& left, const tensor_frame_info& right) {
  return !(left == right);
}

bool operator==(const message_header& left, const message_header& right) {
  return left.protocol_version == right.protocol_version && left.kind == right.kind &&
         left.job_id == right.job_id && left.key == right.key &&
         left.source_stage == right.source_stage && left.target_stage == right.target_stage &&
         left.weight_version == right.weight_version && left.step == right.step &&
         left.sample_offset == right.sample_offset && left.frames == right.frames &&
         left.metrics == right.metrics && left.text == right.text;
}

bool operator!=(const message_header& left, const message_header& right) {
  return !(left == right);
}

frame copy_frame(const void* data, size_t bytes) {
  if (bytes == 0) return frame{};
  // operator new[] aligns to __STDCPP_DEFAULT_NEW_ALIGNMENT__, enough for every element type.
  std::shared_ptr<std::byte[]> copy(new std::byte[bytes]);
  std::memcpy(copy.get(), data, bytes);
  const void* view = copy.get();
  return frame{std::shared_ptr<const void>(copy, view), view, bytes};
}

void add_payload(message& into, std::vector<int64_t> dims,
                 std::shared_ptr<const std::vector<float>> values) {
  into.header.frames.push_back(tensor_frame_info{element_type::float32, std::move(dims)});
  into.payloads.push_back(make_frame(std::move(values)));
}

void add_payload(message& into, std::vector<int64_t> dims,
                 std::shared_ptr<const std::vector<int32_t>> values) {
  into.header.frames.push_back(tensor_frame_info{element_type::int32, std::move(dims)});
  into.payloads.push_back(make_frame(std::move(values)));
}

void add_payload(message& into, std::shared_ptr<const std::string> values) {
  const int64_t size = static_cast<int64_t>(values->size());
  into.header.frames.push_back(tensor_frame_info{element_type::bytes, {size}});
  const void* data = values->data();
  into.payloads.push_back(
      frame{std::shared_ptr<const void>(std::move(values)), data, static_cast<size_t>(size)});
}

}  // namespace troupe::transport
