#include "apps/lab/race_table.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>

#include "apps/lab/statistics.h"

namespace troupe::apps {
namespace {

using json = nlohmann::json;

/// Seconds to the target of the runs that reached it.
std::vector<double> reached_seconds(const std::vector<race_outcome>& runs) {
  std::vector<double> seconds;
  for (const race_outcome& run : runs) {
    if (run.to_target_s) seconds.push_back(*run.to_target_s);
  }
  return seconds;
}

/// The median of `field` over the runs that have it, printed with `format` ("-" where none has).
template <typename T>
std::string median_cell(const std::vector<race_outcome>& runs,
                        std::optional<T> race_outcome::*field, const char* format) {
  std::vector<double> values;
  for (const race_outcome& run : runs) {
    if (run.*field) values.push_back(static_cast<double>(*(run.*field)));
  }
  if (values.empty()) return "-";
  char text[32];
  std::snprintf(text, sizeof text, format, median(values));
  return text;
}

/// The median of the steps at which the runs that reached the target reached it.
std::string steps_cell(const std::vector<race_outcome>& runs) {
  return median_cell(runs, &race_outcome::to_target_step, "%.0f");
}

/// "median (min-max)" of the runs that reached the target, and how many did.
std::string seconds_cell(const std::vector<race_outcome>& runs, int* reached) {
  const std::vector<double> seconds = reached_seconds(runs);
  *reached = static_cast<int>(seconds.size());
  if (seconds.empty()) return "-";
  char text[64];
  std::snprintf(text, sizeof text, "%.1f (%.1f-%.1f)", median(seconds),
                *std::min_element(seconds.begin(), seconds.end()),
                *std::max_element(seconds.begin(), seconds.end()));
  return text;
}

double median_accuracy(const std::vector<race_outcome>& runs) {
  std::vector<double> accuracies;
  for (const race_outcome& run : runs) {
    if (!run.diverged && !run.failed) accuracies.push_back(run.final_accuracy);
  }
  return median(accuracies);
}

/// The median of the runs' mean staleness.
std::string staleness_cell(const std::vector<race_outcome>& runs) {
  return median_cell(runs, &race_outcome::mean_staleness, "%.2f");
}

int diverged_count(const std::vector<race_outcome>& runs) {
  return static_cast<int>(std::count_if(runs.begin(), runs.end(),
                                        [](const race_outcome& run) { return run.diverged; }));
}

json runs_json(const std::vector<race_outcome>& runs) {
  json result = json::array();
  for (const race_outcome& run : runs) {
    result.push_back({{"diverged", run.diverged},
                      {"failed", run.failed},
                      {"time_to_target_s", run.to_target_s ? json(*run.to_target_s) : json()},
                      {"steps_to_target", run.to_target_step ? json(*run.to_target_step) : json()},
                      {"final_test_accuracy", run.final_accuracy},
                      {"mean_staleness", run.mean_staleness ? json(*run.mean_staleness) : json()}});
  }
  return result;
}

/// The table's header, with the predicted columns when `predicting`.
void print_header(bool predicting) {
  std::printf("\n%-20s %5s %9s %7s %8s %22s %6s %10s %9s", "setting", "runs", "diverged", "failed",
              "reached", "to target s (min-max)", "steps", "final acc", "staleness");
  if (predicting) {
    std::printf(" | %22s %6s %10s %9s %9s", "predicted to target s", "steps", "final acc",
                "diverged", "staleness");
  }
  std::printf("\n");
}

/// The measured columns of a setting's row.
void print_measured(const std::string& name, const std::vector<race_outcome>& runs) {
  int reached = 0;
  const std::string seconds = seconds_cell(runs, &reached);
  std::printf("%-20s %5zu %9d %7d %8d %22s %6s %10.4f %9s", name.c_str(), runs.size(),
              diverged_count(runs), failed_count(runs), reached, seconds.c_str(),
              steps_cell(runs).c_str(), median_accuracy(runs), staleness_cell(runs).c_str());
}

/// The predicted columns of a setting's row.
void print_predicted(const std::vector<race_outcome>& runs) {
  int reached = 0;
  const std::string seconds = seconds_cell(runs, &reached);
  std::printf(" | %22s %6s %10.4f %9d %9s", seconds.c_str(), steps_cell(runs).c_str(),
              median_accuracy(runs), diverged_count(runs), staleness_cell(runs).c_str());
}

}  // namespace

json print_race_table(const std::vector<setting>& settings,
                      const std::vector<std::vector<race_outcome>>& measured,
                      const std::vector<std::vector<race_outcome>>& predicted, bool predicting,
                      double target_accuracy, int seeds) {
  print_header(predicting);
  json table = json::array();
  for (size_t s = 0; s < settings.size(); ++s) {
    print_measured(settings[s].name, measured[s]);
    json row = {{"setting", settings[s].name},
                {"overrides", settings[s].overrides},
                {"runs", runs_json(measured[s])}};
    if (predicting) {
      print_predicted(predicted[s]);
      row["predicted"] = runs_json(predicted[s]);
    }
    std::printf("\n");
    table.push_back(row);
  }
  std::printf(
      "(seconds from the start of each run to its first evaluation at or above "
      "training.target_accuracy (%.4g), evaluations included; medians over the runs that "
      "reached it; steps: the median of the optimizer steps completed by then; seeds 1-%d, "
      "settings in alternating order; staleness: the median over the runs "
      "of the mean staleness of every backward pass)\n",
      target_accuracy, seeds);
  return table;
}

void print_ranking(const std::vector<std::string>& names,
                   const std::vector<std::vector<race_outcome>>& measured,
                   const std::vector<std::vector<race_outcome>>& predicted) {
  std::vector<std::vector<double>> measured_seconds, predicted_seconds;
  for (size_t s = 0; s < names.size(); ++s) {
    measured_seconds.push_back(reached_seconds(measured[s]));
    predicted_seconds.push_back(reached_seconds(predicted[s]));
  }
  const ranking_agreement ranking = compare_rankings(measured_seconds, predicted_seconds);
  std::printf(
      "ranking: the prediction orders %d of %d pairs of settings as measured; %d of the %d pairs "
      "whose middle runs do not overlap\n",
      ranking.agreeing, ranking.pairs, ranking.apart_agreeing, ranking.apart);
  for (const ranked_pair& pair : ranking.disagreeing) {
    const double measured_i = ranking.measured_medians[pair.i];
    const double measured_j = ranking.measured_medians[pair.j];
    const double predicted_i = ranking.predicted_medians[pair.i];
    const double predicted_j = ranking.predicted_medians[pair.j];
    std::printf(
        "  %s / %s: measured %.1f %c %.1f s (median steps %s / %s), predicted %.1f %c %.1f s%s\n",
        names[pair.i].c_str(), names[pair.j].c_str(), measured_i,
        measured_i < measured_j ? '<' : '>', measured_j, steps_cell(measured[pair.i]).c_str(),
        steps_cell(measured[pair.j]).c_str(), predicted_i, predicted_i < predicted_j ? '<' : '>',
        predicted_j, pair.apart ? "" : " (their middle runs overlap)");
  }
}

int failed_count(const std::vector<race_outcome>& runs) {
  return static_cast<int>(
      std::count_if(runs.begin(), runs.end(), [](const race_outcome& run) { return run.failed; }));
}

}  // namespace troupe::apps
