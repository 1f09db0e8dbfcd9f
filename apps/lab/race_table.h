#pragma once

// `troupe converge`'s table: for each setting, how soon its runs reached the target (median and
// range of the seconds, the steps), their final accuracy and staleness, and the diverged and
// failed runs, measured and predicted side by side, and how the prediction ranks the settings.

#include <vector>

#include <nlohmann/json.hpp>

#include "apps/cli/sweep_option.h"
#include "apps/lab/converge_prediction.h"

namespace troupe::apps {

/// Prints the table, a row per setting (runs[s] are settings[s]'s), with the predicted columns
/// when `predicting`, and its footnote; returns it as convergence.json holds it.
nlohmann::json print_race_table(const std::vector<setting>& settings,
                                const std::vector<std::vector<race_outcome>>& measured,
                                const std::vector<std::vector<race_outcome>>& predicted,
                                bool predicting, double target_accuracy, int seeds);

/// How the prediction orders the settings by their median seconds to the target, pair by pair,
/// counting apart the pairs whose middle runs do not overlap (compare_rankings()): a ranking of
/// settings within each other's spread is not settled by the runs themselves.
void print_ranking(const std::vector<std::string>& names,
                   const std::vector<std::vector<race_outcome>>& measured,
                   const std::vector<std::vector<race_outcome>>& predicted);

/// The runs that failed other than by diverging.
int failed_count(const std::vector<race_outcome>& runs);

}  // namespace troupe::apps
