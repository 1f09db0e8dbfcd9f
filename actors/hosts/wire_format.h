#pragma once

// Translation between the state machines' messages and transport frames: a key's tensor goes
// out without a copy on the CPU (the frame holds the tensor's buffer) and with one device-to-
// host copy into a pinned buffer on a GPU (the frame owns that buffer), and comes in as a
// tensor on the receiving stage's device; reports travel as named scalars. A frame made here
// may refer to its tensor's backend until it is released, so the backend must outlive the
// transport that carries it (the hosts free backends after their ZeroMQ context has ended).

#include <cstdint>
#include <optional>
#include <string>

#include "actors/engine/pipeline_messages.h"
#include "transport/message.h"

namespace troupe::actors {

/// Where a message goes and what its sender stamps on it.
struct wire_route {
  uint64_t job_id = 0;
  int32_t source_stage = transport::coordinator_stage;
  int32_t target_stage = transport::coordinator_stage;
  int64_t weight_version = 0;
  double sent_s = 0;  ///< sender's clock, for the trace's message arrows
};

/// A key message as frames: payload (float32) then labels (int32). The payload must be finished
/// (no work still pending on it, as stage_device promises for what it returns).
transport::message to_wire(const key_message& message, const wire_route& route);

/// A stage's report for the coordinator (loss_report or retired).
transport::message report_to_wire(const stage_output& report, const wire_route& route);

/// The key message a stage receives, its payload copied to `device` and finished (the copy is
/// synchronized, so `message` may be released at once and any stream may read the payload).
/// Returns nothing with `error` set when the frames do not form a key message (a peer's bug,
/// not ours to crash on).
std::optional<key_message> key_from_wire(const transport::message& message, layers::backend& device,
                                         std::string* error);

/// The report a coordinator receives; nothing with `error` set for a malformed one.
std::optional<stage_output> report_from_wire(const transport::message& message, std::string* error);

/// A state message (save_state, load_state, load_weights, stage_state, state_loaded,
/// state_refused) for checkpoint step `step`. `shard` (may
/// be null: a save request or a load's acknowledgement) travels as bytes frames of at most
/// 256 MiB each, viewing the string in place.
transport::message state_to_wire(transport::message_kind kind, int64_t step,
                                 std::shared_ptr<const std::string> shard, const wire_route& route);

/// The shard bytes a state message carries (its bytes frames joined); empty when it has none.
/// Nothing, with `error` set, when a frame is not a bytes frame.
std::optional<std::string> state_from_wire(const transport::message& message, std::string* error);

/// The sender's clock stamped by wire_route::sent_s.
double sent_time(const transport::message& message);

}  // namespace troupe::actors
