#pragma once

// The job schema: every section and key of a job file, bound to the job_config member it reads
// and writes, with its description. The one place that defines a key: reading, unknown-key
// suggestions, to_json(), `troupe keys` and docs/guide/job-file.md all walk it; a key's default
// is what its field writes from a default-constructed job_config. Internal to actors/config.

#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/config/toml_fields.h"

namespace troupe::actors::detail {

/// Every section and key, bound to `config`, in the order messages and checks use.
std::vector<section> job_schema(job_config& config);

/// A block of `type` with that type's defaults (a maxpool2d's 2 × 2 window, ...).
layers::layer_spec layer_with_defaults(const std::string& type);

/// The keys a block of `spec.type` takes besides `type`, bound to `spec`.
std::vector<field> layer_fields(layers::layer_spec& spec);

/// One line on what a block of a built-in `type` computes ("" for other types).
std::string layer_type_description(const std::string& type);

}  // namespace troupe::actors::detail
