#pragma once

// Reading a job file: TOML text plus `--set section.key=value` overrides in, a validated
// job_config with every default filled in out. Bad input is reported as a job_error value;
// no exception escapes these functions.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/job_config.h"

namespace troupe::actors {

/// Why a job could not be read: one line naming the file (or source) and the offending key.
struct job_error {
  std::string message;
};

/// Parses `toml_text` (called `source_name` in messages), applies `overrides` ("section.key=
/// value", in order; the value is read as TOML, or as a plain string when it is not valid TOML),
/// validates every key and fills the defaults. On failure returns nothing and sets `*error`
/// when `error` is not null. On success sets `*warnings`, when not null, to one line per key
/// the job sets to no effect or at a cost it may not expect ("SOURCE: parallelism.
/// min_update_interval does nothing in sync mode: ..."; see job_warnings()).
std::optional<job_config> parse_job(const std::string& toml_text, const std::string& source_name,
                                    const std::vector<std::string>& overrides, job_error* error,
                                    std::vector<std::string>* warnings = nullptr);

/// parse_job() on the contents of the file at `path`; a missing or unreadable file is an error
/// that names it.
std::optional<job_config> load_job_file(const std::string& path,
                                        const std::vector<std::string>& overrides, job_error* error,
                                        std::vector<std::string>* warnings = nullptr);

/// The resolved configuration as JSON: one object per section with every key, named as in the
/// job file (what `troupe train` writes to DIR/config.json). Cut points of
/// `parallelism.partition` are written as an array, as the job file spells them: block indices,
/// and "block:row" for a cut inside a linear layer, whose layer is written whole (see
/// actors/config/layer_cuts.h).
nlohmann::json to_json(const job_config& config);

/// 16 lowercase hex digits: FNV-1a 64 of to_json(config).dump(). Stable across runs and builds
/// because the JSON object keys are sorted.
std::string config_hash(const job_config& config);

/// The hash a checkpoint records and a resume must match: config_hash over everything that
/// shapes the training state, leaving out what may change between runs of one job
/// (training.epochs, max_steps and target_accuracy, parallelism.threads, devices and replicas,
/// model.init_from, [checkpoint] and [metrics]).
std::string checkpoint_config_hash(const job_config& config);

/// What every process of one run must agree on: checkpoint_config_hash() and the number of
/// replicas (a worker started for another number of replicas is refused).
std::string job_identity_hash(const job_config& config);

}  // namespace troupe::actors
