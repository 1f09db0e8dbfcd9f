#pragma once

// The transport's part of `troupe calibrate`: one message's latency and bandwidth between two
// ipc:// endpoints, and what one end of a key's message costs in CPU in one process and between
// processes.

#include <cstdint>
#include <string>

#include "layers/backend.h"
#include "layers/tensor.h"
#include "sim/profile.h"

namespace troupe::sim {

/// Times one message between processes (latency and bandwidth) and what one end of a key's
/// message costs in CPU, in one process and between processes, at the input's size and at the
/// job's biggest message, `biggest_samples` × `biggest` (a key of its biggest sample among its
/// input and its blocks' outputs, or a replica's all-reduce piece). Sets `profile`'s link and
/// message fields; false with `error` set when a round failed.
bool time_transport(machine_profile* profile, layers::backend& device, const layers::shape& input,
                    const layers::shape& biggest, int64_t biggest_samples, std::string* error);

}  // namespace troupe::sim
