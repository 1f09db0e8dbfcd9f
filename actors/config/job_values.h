#pragma once

// Readers of the job-file values that need more than a number or a string: device names, the
// cut points of parallelism.partition, and probabilities held as floats. Internal to
// actors/config (the job schema binds them).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/toml_fields.h"

namespace troupe::actors::detail {

/// A key whose value is a probability in [0, 1) held as a float.
field probability_field(const char* name, float* probability);

/// A string names the device of every stage; an array names one per stage.
problem read_devices(const toml::node& node, const std::string& label,
                     std::vector<std::string>* out);

/// "balanced", "measured", "uniform", an array of cut points, or cut points as a string ("3,7",
/// so that `--set parallelism.partition=3,7` works); cut points are stored comma-joined.
problem read_partition(const toml::node& node, const std::string& label, std::string* out);

/// Cut points as an array: block indices as numbers, cuts inside a layer as "block:row".
nlohmann::json partition_json(const std::string& partition);

}  // namespace troupe::actors::detail
