#pragma once

// This machine as a cluster for the simulator, and the share of its cores that a job's stages
// get as processes of their own.

#include <optional>
#include <string>

#include "actors/config/job_config.h"
#include "sim/cluster_model.h"
#include "sim/profile.h"

namespace troupe::sim {

/// This machine as a cluster: one node, one device per core, pooled (the stages' threads run on
/// whichever core is free); `profile` supplies the transport. With `in_process` the stages
/// share one process's scheduler with a thread per core, and each runs its work to the end;
/// otherwise each stage is a process of its own, which the operating system time-slices with
/// the others when there are more stages than cores (at the profile's time_slice_efficiency).
std::optional<cluster_model> this_machine(const machine_profile& profile, bool in_process,
                                          std::string* error);

/// The time_slice_efficiency at which the simulator, charging `profile`'s costs on
/// this_machine() with a process per stage, trains `config` at `keys_per_s` keys per second once
/// its pipeline is full: what a stand-in pipeline of the job's stages measured. The simulator
/// charges the share only while the working stages keep every core busy, so the share it needs
/// is lower than the measured rate over fair sharing, the more so the more the job's schedule
/// (a sync flush) leaves a core to spare. 1 when even fair sharing is no faster than
/// `keys_per_s`, at least 0.05; nothing, with `error` set, when a simulation fails.
std::optional<double> fit_time_slice_efficiency(const actors::job_config& config,
                                                const machine_profile& profile, double keys_per_s,
                                                std::string* error);

}  // namespace troupe::sim
