#pragma once

// The data sets a job trains and evaluates on, and the checks that tie them to its model.

#include <optional>
#include <string>

#include "actors/config/job_config.h"
#include "layers/dataset.h"

namespace troupe::actors {

struct job_data {
  layers::dataset train;
  layers::dataset test;
};

/// Loads (or synthesizes) the job's training and test sets, truncated and standardized as
/// [data] says. On failure returns nothing with `error` naming the file and the problem.
std::optional<job_data> load_job_data(const job_config& config, std::string* error);

/// Checks that the model's layers chain from model.input_shape and end in one output per
/// class of `classes`; the message names the offending block or key. A graph model
/// (model.nodes) gets check_model_graph() on the arity its data will have
/// (model_graph_checks.h), and its last node's rows must match the data's labels: one score
/// per class of `classes` for each listops instance, one row per part for text-records.
bool check_model(const job_config& config, int classes, std::string* error);

}  // namespace troupe::actors
