#pragma once

// What stages exchange: a versioned header (who sends what to whom, for which key and weight
// version, and the shape of every payload) plus raw payload frames that travel without being
// copied. A frame keeps its bytes alive through a type-erased shared owner, so a sender can hand
// a tensor buffer to ZeroMQ and a receiver can hold a received buffer for as long as it needs.
// These are plain values: no ZeroMQ, Cereal or CAF types appear here.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace troupe::transport {

/// Wire protocol version this build writes into every header; decoders reject any other.
inline constexpr uint16_t current_protocol_version = 6;

/// Stage number that stands for the coordinator in source_stage / target_stage.
inline constexpr int32_t coordinator_stage = -1;

/// What a message asks its receiver to do.
enum class message_kind : uint8_t {
  forward,         ///< activations of one key travelling towards the last stage
  backward,        ///< gradients of one key travelling towards stage 0
  evaluate,        ///< activations of an evaluation batch: no backward pass follows
  loss_report,     ///< loss / accuracy figures (in message_header::metrics) for the coordinator
  control,         ///< coordinator commands and acknowledgements (admit, checkpoint, stop)
  save_state,      ///< coordinator → stage: send your state for the checkpoint of step `step`
  load_state,      ///< coordinator → stage: continue from the shard in the payload frames
  stage_state,     ///< stage → coordinator: its saved shard, in the payload frames
  load_weights,    ///< coordinator → stage: take only the weights of the shard (initial weights)
  state_loaded,    ///< stage → coordinator: the shard of a load_state / load_weights is in place
  state_refused,   ///< stage → coordinator: the shard did not fit; `text` says why
  key_retired,     ///< stage 0 → coordinator: key `key` finished its backward pass
  optimizer_step,  ///< stage → next stage: take the step held since key `key`'s backward pass
  gradient_chunk,  ///< stage → same stage of the next replica: a ring all-reduce chunk (ring
                   ///< step `key` of round `step`), one float32 frame
};

/// Number of message_kind values; a kind byte at or above it is invalid on the wire.
inline constexpr uint8_t message_kind_count = 14;

/// Element type of a payload frame.
enum class element_type : uint8_t {
  float32 = 0,  ///< activations, gradients
  int32 = 1,    ///< class labels
  bytes = 2,    ///< opaque bytes (checkpoint shards)
};

/// Number of element_type values; a dtype byte at or above it is invalid on the wire.
inline constexpr uint8_t element_type_count = 3;

/// Bytes per element of `type`.
size_t element_size(element_type type);

/// "forward", "backward", ... (for log lines and error messages).
const char* to_string(message_kind kind);

/// "float32", "int32" or "bytes".
const char* to_string(element_type type);

/// Shape and element type of one payload frame, as announced by the header.
struct tensor_frame_info {
  element_type dtype = element_type::float32;
  /// Row-major dimensions, batch first; at most decode_limits::max_dims, none negative.
  std::vector<int64_t> dims;
};

/// Frame 0 of every message: everything but the payload bytes.
struct message_header {
  /// Version of the wire layout; current_protocol_version unless a test forges another.
  uint16_t protocol_version = current_protocol_version;
  message_kind kind = message_kind::control;
  /// Job this message belongs to, so that a receiver can ignore messages of other jobs.
  uint64_t job_id = 0;
  /// The in-flight training instance (micro-batch) this message carries.
  uint64_t key = 0;
  /// Sending stage (coordinator_stage for the coordinator).
  int32_t source_stage = coordinator_stage;
  /// Receiving stage (coordinator_stage for the coordinator).
  int32_t target_stage = coordinator_stage;
  /// The sender's weight version when it produced the payload (staleness is measured with it).
  uint64_t weight_version = 0;
  /// Optimizer step of the job the key belongs to.
  int64_t step = 0;
  /// Index of the key's first sample in the epoch's sample order (lets a stage fetch labels).
  int64_t sample_offset = 0;
  /// One entry per payload frame, in frame order.
  std::vector<tensor_frame_info> frames;
  /// Named scalars of loss reports and control messages ("loss", "correct", "samples", ...);
  /// at most decode_limits::max_metrics entries with names of at most max_metric_name_bytes.
  std::map<std::string, double> metrics;
  /// Free text of control messages (a resolved job config as JSON, an address, a reason); at
  /// most decode_limits::max_text_bytes, empty for data messages.
  std::string text;
};

/// Field-by-field equality (metrics compared with ==, so NaN values never compare equal).
bool operator==(const tensor_frame_info& left, const tensor_frame_info& right);
bool operator!=(const tensor_frame_info& left, const tensor_frame_info& right);
bool operator==(const message_header& left, const message_header& right);
bool operator!=(const message_header& left, const message_header& right);

/// A read-only run of payload bytes that stays alive while any copy of the frame (or ZeroMQ,
/// while it sends or queues it) holds `owner`. Copies are shallow. The owner's last release may
/// happen on any thread, including a ZeroMQ I/O thread, so its deleter must be thread-safe.
struct frame {
  /// Keeps `data` alive; empty only for frames of zero bytes.
  std::shared_ptr<const void> owner;
  /// First byte; aligned to the element size once the frame has passed decode_message().
  const void* data = nullptr;
  /// Length of the payload in bytes.
  size_t bytes = 0;
};

/// A frame viewing all of `values`, which it keeps alive; the vector must not be modified while
/// any holder of the frame exists.
template <class T>
frame make_frame(std::shared_ptr<const std::vector<T>> values) {
  const void* data = values->data();
  size_t bytes = values->size() * sizeof(T);
  return frame{std::shared_ptr<const void>(std::move(values)), data, bytes};
}

/// A frame owning a fresh copy of `bytes` bytes at `data` (aligned for any element type).
frame copy_frame(const void* data, size_t bytes);

/// A header and its payload frames; payloads[i] is described by header.frames[i].
struct message {
  message_header header;
  std::vector<frame> payloads;
};

/// Appends a float32 payload of shape `dims` viewing `values` (not copied) to `into`; the sizes
/// are checked when the message is sent or decoded, not here.
void add_payload(message& into, std::vector<int64_t> dims,
                 std::shared_ptr<const std::vector<float>> values);

/// Appends `values` as a one-dimensional bytes payload (not copied).
void add_payload(message& into, std::shared_ptr<const std::string> values);

/// Appends an int32 payload of shape `dims` viewing `values` (not copied) to `into`.
void add_payload(message& into, std::vector<int64_t> dims,
                 std::shared_ptr<const std::vector<int32_t>> values);

}  // namespace troupe::transport
