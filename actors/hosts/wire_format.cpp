#include "actors/hosts/wire_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace troupe::actors {
namespace {

transport::message_kind kind_on_wire(key_kind kind) {
  switch (kind) {
    case key_kind::forward:
      return transport::message_kind::forward;
    case key_kind::backward:
      return transport::message_kind::backward;
    case key_kind::evaluate:
      return transport::message_kind::evaluate;
    case key_kind::step:
      return transport::message_kind::optimizer_step;
    case key_kind::reduce:
      return transport::message_kind::gradient_chunk;
  }
  return transport::message_kind::control;
}

transport::message_header header_for(transport::message_kind kind, uint64_t key,
                                     const wire_route& route) {
  transport::message_header header;
  header.kind = kind;
  header.job_id = route.job_id;
  header.key = key;
  header.source_stage = route.source_stage;
  header.target_stage = route.target_stage;
  header.weight_version = static_cast<uint64_t>(route.weight_version);
  header.metrics["sent_s"] = route.sent_s;
  return header;
}

/// A frame reading the tensor's memory in place (CPU, where device memory is host memory), or
/// else one DMA copy of it in a pinned host buffer of the tensor's backend, which the frame
/// owns: ZeroMQ sends from that buffer without copying it again (or, in one process, hands it
/// to the receiving stage), and the buffer goes back to the backend's pool when the last
/// holder releases the frame, on whatever thread that is. The tensor must be finished
/// (stage_device's contract), so reading it on the default stream needs no ordering with the
/// stream that wrote it; the copy is synchronized before the frame exists.
transport::frame frame_of(const layers::tensor& tensor) {
  const size_t bytes = static_cast<size_t>(tensor.size()) * sizeof(float);
  layers::backend& device = tensor.device();
  if (device.kind() == layers::device_kind::cpu) {
    return transport::frame{tensor.storage(), tensor.data(), bytes};
  }
  void* host = device.allocate_host(bytes);
  std::shared_ptr<const void> owner(host, [backend = &device](const void* block) {
    backend->deallocate_host(const_cast<void*>(block));
  });
  const layers::stream s = device.default_stream();
  device.copy_device_to_host(s, host, tensor.data(), bytes);
  device.synchronize(s);
  return transport::frame{std::move(owner), host, bytes};
}

/// A ring all-reduce chunk: one one-dimensional float32 frame, kept in host memory.
std::optional<key_message> chunk_from_wire(const transport::message& message, std::string* error) {
  const auto& frames = message.header.frames;
  if (frames.size() != 1 || frames[0].dtype != transport::element_type::float32 ||
      frames[0].dims.size() != 1 || message.header.step < 0 ||
      message.header.key > static_cast<uint64_t>(1 << 20) || message.header.sample_offset < 0 ||
      message.header.sample_offset > (1 << 30)) {
    *error =
        "a gradient_chunk message carries one one-dimensional float32 frame, a round >= 0, "
        "a ring step and a piece";
    return std::nullopt;
  }
  key_message result;
  result.kind = key_kind::reduce;
  result.key = message.header.key;
  result.step = message.header.step;
  result.sample_offset = message.header.sample_offset;
  // The frame's own memory (aligned for floats once decoded), kept alive by the view.
  const transport::frame& frame = message.payloads[0];
  result.values = float_view{frame.owner, static_cast<const float*>(frame.data),
                             static_cast<int64_t>(frame.bytes / sizeof(float))};
  return result;
}

/// A dynamic model's instances as one int32 frame: their count, then per instance its parts P,
/// its parent entries (0 or P) and its labels L, followed by its P tokens, the parent entries
/// and the L labels.
std::shared_ptr<const std::vector<int32_t>> encode_instances(
    const std::vector<layers::instance>& instances) {
  auto values = std::make_shared<std::vector<int32_t>>();
  values->push_back(static_cast<int32_t>(instances.size()));
  for (const layers::instance& item : instances) {
    values->push_back(static_cast<int32_t>(item.tokens.size()));
    values->push_back(static_cast<int32_t>(item.parent.size()));
    values->push_back(static_cast<int32_t>(item.labels.size()));
    values->insert(values->end(), item.tokens.begin(), item.tokens.end());
    values->insert(values->end(), item.parent.begin(), item.parent.end());
    values->insert(values->end(), item.labels.begin(), item.labels.end());
  }
  return values;
}

/// The instances of encode_instances(); nothing, with `error` set, when the counts do not fit
/// the frame or an instance is not well formed (a parent out of order, not one root).
std::optional<std::vector<layers::instance>> decode_instances(const int32_t* values, size_t count,
                                                              std::string* error) {
  size_t at = 0;
  auto next = [&](int32_t* value) {
    if (at >= count) return false;
    *value = values[at++];
    return true;
  };
  int32_t instances = 0;
  if (!next(&instances) || instances < 0 || static_cast<size_t>(instances) > count) {
    *error = "the instances frame does not start with a count that fits it";
    return std::nullopt;
  }
  std::vector<layers::instance> result(static_cast<size_t>(instances));
  for (layers::instance& item : result) {
    int32_t parts = 0, parents = 0, labels = 0;
    if (!next(&parts) || !next(&parents) || !next(&labels) || parts < 1 ||
        (parents != 0 && parents != parts) || labels < 0 ||
        static_cast<size_t>(parts) + parents + labels > count - at) {
      *error = "an instance in the instances frame has counts that do not fit it";
      return std::nullopt;
    }
    item.tokens.assign(values + at, values + at + parts);
    at += static_cast<size_t>(parts);
    item.parent.assign(values + at, values + at + parents);
    at += static_cast<size_t>(parents);
    item.labels.assign(values + at, values + at + labels);
    at += static_cast<size_t>(labels);
    for (int32_t part = 0; part < parents; ++part) {
      const int32_t parent = item.parent[static_cast<size_t>(part)];
      const bool root = part + 1 == parts;
      if (root ? parent != -1 : parent <= part || parent >= parts) {
        *error = "an instance in the instances frame is not a tree whose last part is its root";
        return std::nullopt;
      }
    }
  }
  if (at != count) {
    *error = "the instances frame holds more than its instances";
    return std::nullopt;
  }
  return result;
}

}  // namespace

transport::message to_wire(const key_message& message, const wire_route& route) {
  transport::message result;
  result.header = header_for(kind_on_wire(message.kind), message.key, route);
  result.header.step = message.step;
  result.header.sample_offset = message.sample_offset;
  if (message.norm_squared != 0) result.header.metrics["norm_squared"] = message.norm_squared;
  if (message.replica_floor != 0) {
    result.header.metrics["replica_floor"] = static_cast<double>(message.replica_floor);
  }
  if (!message.payload.empty()) {
    result.header.frames.push_back({transport::element_type::float32, message.payload.dims()});
    result.payloads.push_back(frame_of(message.payload));
  }
  if (message.labels) {
    transport::add_payload(result, {static_cast<int64_t>(message.labels->size())}, message.labels);
  }
  if (message.instances) {
    // After the labels (which a backward message lacks): the flag says the last int32 frame
    // holds the instances.
    result.header.metrics["instances"] = 1;
    auto values = encode_instances(*message.instances);
    transport::add_payload(result, {static_cast<int64_t>(values->size())}, values);
  }
  if (message.kind == key_kind::reduce) {
    result.header.frames.push_back({transport::element_type::float32, {message.values.count}});
    result.payloads.push_back(
        transport::frame{message.values.owner, message.values.data,
                         static_cast<size_t>(message.values.count) * sizeof(float)});
  }
  return result;
}

transport::message report_to_wire(const stage_output& report, const wire_route& route) {
  const bool loss = report.what == stage_output::kind::loss_report;
  transport::message result;
  result.header =
      header_for(loss ? transport::message_kind::loss_report : transport::message_kind::key_retired,
                 report.message.key, route);
  result.header.step = report.message.step;
  if (loss) {
    result.header.metrics["loss_sum"] = report.loss_sum;
    result.header.metrics["correct"] = static_cast<double>(report.correct);
    result.header.metrics["samples"] = static_cast<double>(report.samples);
  }
  return result;
}

std::optional<key_message> key_from_wire(const transport::message& message, layers::backend& device,
                                         std::string* error) {
  key_message result;
  switch (message.header.kind) {
    case transport::message_kind::forward:
      result.kind = key_kind::forward;
      break;
    case transport::message_kind::backward:
      result.kind = key_kind::backward;
      break;
    case transport::message_kind::evaluate:
      result.kind = key_kind::evaluate;
      break;
    case transport::message_kind::optimizer_step:
      result.kind = key_kind::step;
      break;
    case transport::message_kind::gradient_chunk:
      return chunk_from_wire(message, error);
    default:
      *error = std::string("a stage cannot handle a ") + transport::to_string(message.header.kind) +
               " message";
      return std::nullopt;
  }
  result.key = message.header.key;
  result.step = message.header.step;
  result.sample_offset = message.header.sample_offset;
  auto norm = message.header.metrics.find("norm_squared");
  if (norm != message.header.metrics.end()) result.norm_squared = norm->second;
  auto floor = message.header.metrics.find("replica_floor");
  if (floor != message.header.metrics.end()) {
    if (!(floor->second >= 0 && floor->second < 1e15)) {
      *error = "replica_floor must be a weight version >= 0";
      return std::nullopt;
    }
    result.replica_floor = static_cast<int64_t>(floor->second);
  }
  const bool has_instances = message.header.metrics.count("instances") > 0;
  size_t frames = message.payloads.size();
  if (has_instances) {
    if (frames == 0 || message.header.frames[frames - 1].dtype != transport::element_type::int32) {
      *error = "a key message flagged with instances lacks their int32 frame";
      return std::nullopt;
    }
    const transport::frame& frame = message.payloads[--frames];
    auto instances = decode_instances(static_cast<const int32_t*>(frame.data),
                                      frame.bytes / sizeof(int32_t), error);
    if (!instances) return std::nullopt;
    result.instances = std::make_shared<const std::vector<layers::instance>>(std::move(*instances));
  }
  for (size_t i = 0; i < frames; ++i) {
    const transport::tensor_frame_info& info = message.header.frames[i];
    const transport::frame& frame = message.payloads[i];
    if (info.dtype == transport::element_type::float32 && result.payload.empty()) {
      // One copy straight from the frame into device memory, finished before the tensor is
      // handed on (the stage reads it on its own stream) and before the frame, whose memory
      // the copy reads, can be released. The frame is ZeroMQ's buffer (ipc://, tcp://), which
      // we cannot choose to be pinned: CUDA copies such pageable memory through its own pinned
      // staging buffer, which is what a staging buffer of ours would add, so none is used. In
      // one process (inproc://) the frame is the sender's pinned buffer and the copy is a
      // direct DMA transfer. On the CPU this is the one memcpy the decode has always made.
      result.payload = layers::tensor(device, info.dims);
      result.payload.copy_from_host(device.default_stream(), static_cast<const float*>(frame.data));
      device.synchronize(device.default_stream());
    } else if (info.dtype == transport::element_type::int32 && !result.labels) {
      const auto* begin = static_cast<const int32_t*>(frame.data);
      result.labels = std::make_shared<const std::vector<int32_t>>(
          begin, begin + frame.bytes / sizeof(int32_t));
    } else {
      *error = "unexpected payload frame " + std::to_string(i) + " in a key message";
      return std::nullopt;
    }
  }
  if (result.kind == key_kind::step) {
    if (!result.payload.empty() || result.labels || result.instances ||
        !(result.norm_squared >= 0) || !std::isfinite(result.norm_squared)) {
      *error = "an optimizer_step message carries no frames and a finite norm_squared >= 0";
      return std::nullopt;
    }
    return result;
  }
  if (result.payload.empty() || (result.kind != key_kind::backward && !result.labels)) {
    *error = "a key message needs a payload (and labels unless it is a backward message)";
    return std::nullopt;
  }
  return result;
}

std::optional<stage_output> report_from_wire(const transport::message& message,
                                             std::string* error) {
  const auto& metrics = message.header.metrics;
  stage_output report;
  report.message.key = message.header.key;
  report.message.step = message.header.step;
  if (message.header.kind == transport::message_kind::loss_report) {
    const auto loss = metrics.find("loss_sum"), correct = metrics.find("correct"),
               samples = metrics.find("samples");
    if (loss == metrics.end() || correct == metrics.end() || samples == metrics.end()) {
      *error = "a loss report needs loss_sum, correct and samples";
      return std::nullopt;
    }
    report.what = stage_output::kind::loss_report;
    report.loss_sum = loss->second;
    report.correct = static_cast<int64_t>(correct->second);
    report.samples = static_cast<int64_t>(samples->second);
    return report;
  }
  if (message.header.kind == transport::message_kind::key_retired) {
    report.what = stage_output::kind::retired;
    return report;
  }
  *error = std::string("the coordinator cannot handle a ") +
           transport::to_string(message.header.kind) + " message";
  return std::nullopt;
}

transport::message state_to_wire(transport::message_kind kind, int64_t step,
                                 std::shared_ptr<const std::string> shard,
                                 const wire_route& route) {
  constexpr size_t chunk = size_t{256} << 20;
  transport::message result;
  result.header = header_for(kind, 0, route);
  result.header.step = step;
  if (!shard) return result;
  for (size_t offset = 0; offset < shard->size(); offset += chunk) {
    const size_t bytes = std::min(chunk, shard->size() - offset);
    result.header.frames.push_back({transport::element_type::bytes, {static_cast<int64_t>(bytes)}});
    result.payloads.push_back(transport::frame{shard, shard->data() + offset, bytes});
  }
  return result;
}

std::optional<std::string> state_from_wire(const transport::message& message, std::string* error) {
  size_t total = 0;
  for (size_t i = 0; i < message.payloads.size(); ++i) {
    if (message.header.frames[i].dtype != transport::element_type::bytes) {
      *error = std::string("a ") + transport::to_string(message.header.kind) +
               " message carries a " + transport::to_string(message.header.frames[i].dtype) +
               " frame";
      return std::nullopt;
    }
    total += message.payloads[i].bytes;
  }
  std::string bytes;
  bytes.reserve(total);
  for (const transport::frame& frame : message.payloads) {
    bytes.append(static_cast<const char*>(frame.data), frame.bytes);
  }
  return bytes;
}

double sent_time(const transport::message& message) {
  auto found = message.header.metrics.find("sent_s");
  return found == message.header.metrics.end() ? 0.0 : found->second;
}

}  // namespace troupe::actors
