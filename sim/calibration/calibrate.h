#pragma once

// `troupe calibrate`: times a job's blocks, messages and time-slicing on this machine, for real
// (real clocks, real threads and processes), into the machine_profile that the simulator
// charges. The only part of sim/ that runs the engine's real transport.

#include <optional>
#include <string>

#include "actors/config/job_config.h"
#include "sim/profile.h"

namespace troupe::sim {

/// Times every block of `config`'s model on the job's first device with the threads a stage
/// gets, at the job's key size, for about `seconds` per block; nothing, with `error` set,
/// when the model cannot be built.
std::optional<machine_profile> calibrate(const actors::job_config& config, double seconds,
                                         std::string* error);

}  // namespace troupe::sim
