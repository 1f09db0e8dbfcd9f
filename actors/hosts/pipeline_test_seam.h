#pragma once

// What tests reach of the in-process host beyond its public API: a hook that sees (and may
// hold up) every message a stage takes. Not installed and not included by troupe.h: the product
// has no fault switch.

#include <functional>
#include <optional>
#include <string>

#include "actors/hosts/pipeline_host.h"

namespace troupe::actors {

/// Called on a stage's thread before the stage takes each message; it may block the stage (a
/// stall on purpose). `actor` is the stage actor's index (replica × stages + stage).
using stage_message_hook = std::function<void(int actor, const message_note& message)>;

/// run_pipeline, with `hook` called by every stage actor as it takes a message.
std::optional<pipeline_report> run_pipeline_with_hook(
    const job_config& config, const job_data& data, training_observer& observer,
    clock_source& clock, const pipeline_options& options, const stage_message_hook& hook,
    std::string* error);

}  // namespace troupe::actors
