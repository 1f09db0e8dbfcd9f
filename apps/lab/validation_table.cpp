#include "apps/lab/validation_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "apps/lab/statistics.h"

namespace troupe::apps {
namespace {

using json = nlohmann::json;

/// A row's figures, from the runs of one column.
struct row_figures {
  double measured = 0;
  double predicted = 0;
  double relative = 0;  ///< the median of the runs' errors, predicted/measured - 1
  double cpu = 0;       ///< microseconds of CPU time per sample
  double kernel = 0;
  double calibration_spread = 0;
  double run_spread = 0;
};

row_figures figures_of(const configuration_runs& result, int column) {
  row_figures figures;
  figures.measured = median(result.measured[column]);
  figures.predicted = median(result.predicted[column]);
  // The error of each run against its own prediction, then their median: the pairs cancel
  // the machine's drift, which the medians of each column alone do not.
  std::vector<double> errors;
  for (size_t run = 0; run < result.measured[column].size(); ++run) {
    errors.push_back(result.predicted[column][run] / result.measured[column][run] - 1);
  }
  figures.relative = median(errors);
  figures.cpu = median(result.cpu_us_per_sample[column]);
  figures.kernel = median(result.kernel_fraction[column]);
  // How much this machine's speed moved while the row ran: the configuration's calibrations
  // minutes apart, and its real runs, each largest over smallest.
  std::vector<double> calibrations = result.predicted_before[column];
  if (!result.predicted_after[column].empty()) {
    calibrations.push_back(result.predicted_after[column].back());
  }
  figures.calibration_spread = spread(calibrations);
  figures.run_spread = spread(result.measured[column]);
  return figures;
}

/// The row's line of the table.
std::string row_line(const validation_row& row, const row_figures& figures, bool replicated) {
  const std::string where =
      row.workers == 0 ? "in-process" : "--workers " + std::to_string(row.workers);
  char replica_column[16] = "";
  if (replicated) std::snprintf(replica_column, sizeof replica_column, " %8d", row.replicas);
  char line[240];
  std::snprintf(line, sizeof line,
                "%-6s %6d%s  %-12s %12.1f %12.1f %+8.1f%% %9.0f %6.0f%% %10.0f%% %7.0f%%",
                row.mode.c_str(), row.stages, replica_column, where.c_str(), figures.measured,
                figures.predicted, 100 * figures.relative, figures.cpu, 100 * figures.kernel,
                100 * figures.calibration_spread, 100 * figures.run_spread);
  return line;
}

/// The row in validation.json.
json row_json(const validation_row& row, const configuration_runs& result,
              const row_figures& figures, int64_t warm_up_steps) {
  const int column = row.workers ? 1 : 0;
  return {{"mode", row.mode},
          {"stages", row.stages},
          {"replicas", row.replicas},
          {"workers", row.workers},
          {"measured_samples_per_s", figures.measured},
          {"measured_runs", result.measured[column]},
          {"predicted_samples_per_s", figures.predicted},
          {"predicted_runs", result.predicted[column]},
          {"predicted_before_runs", result.predicted_before[column]},
          {"predicted_after_runs", result.predicted_after[column]},
          {"whole_run_measured_runs", result.whole_measured[column]},
          {"whole_run_predicted_runs", result.whole_predicted[column]},
          {"warm_up_steps", warm_up_steps},
          {"error", figures.relative},
          {"cpu_us_per_sample", figures.cpu},
          {"kernel_fraction", figures.kernel},
          {"calibration_spread", figures.calibration_spread},
          {"run_spread", figures.run_spread}};
}

}  // namespace

validation_table::validation_table(int64_t warm_up_steps, bool replicated, size_t expected_rows)
    : warm_up_steps_(warm_up_steps), replicated_(replicated), expected_rows_(expected_rows) {}

void validation_table::add_row(const validation_row& row, const configuration_runs& result) {
  const row_figures figures = figures_of(result, row.workers ? 1 : 0);
  const bool within = std::abs(figures.relative) <= 0.10;
  within_rows_ += within ? 1 : 0;
  unresolved_rows_ += !within && std::abs(figures.relative) <=
                                     std::max(figures.calibration_spread, figures.run_spread)
                          ? 1
                          : 0;
  const std::string line = row_line(row, figures, replicated_);
  lines_.push_back(line);
  std::fprintf(stderr, "troupe validate: [%zu/%zu] %s\n", lines_.size(), expected_rows_,
               line.c_str());  // in-process and --workers
  rows_.push_back(row_json(row, result, figures, warm_up_steps_));
}

void validation_table::print(int runs) const {
  std::printf("%-6s %6s%s  %-12s %12s %12s %9s %9s %7s %11s %8s\n", "mode", "stages",
              replicated_ ? " replicas" : "", "run", "measured", "predicted", "error", "cpu",
              "kernel", "calibrated", "runs");
  for (const std::string& line : lines_) std::printf("%s\n", line.c_str());
  std::printf(
      "(samples/s after each run's first %lld steps, its warm-up; medians of %d runs; each run "
      "is predicted from the calibrations taken just before and just after it, and error is the "
      "median of the runs' predicted/measured - 1)\n",
      static_cast<long long>(warm_up_steps_), runs);
  std::printf(
      "(cpu: microseconds of CPU time per training sample, all the run's processes together, "
      "user and kernel, from their start; kernel: the kernel's share of it)\n");
  std::printf(
      "(calibrated, runs: how far apart the row's calibrations, and its real runs, came out: "
      "largest over smallest - 1; the machine's own change of speed while the row ran)\n");
  std::printf("%zu of %zu rows within 10%%", within_rows_, lines_.size());
  if (unresolved_rows_ > 0) {
    std::printf(
        "; %zu more whose error is inside its calibrations' or runs' spread: this "
        "machine changed speed more than the error while they ran, so more --runs, or "
        "a quieter machine, would tell",
        unresolved_rows_);
  }
  std::printf("\n");
  for (const std::string& note : notes_) std::printf("%s\n", note.c_str());
}

}  // namespace troupe::apps
