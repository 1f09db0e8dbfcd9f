#pragma once

// `troupe validate`'s table: a row per configuration and placement, measured against predicted
// samples/s, printed with its footnotes and written as validation.json.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace troupe::apps {

/// One configuration's predictions and measurements, run by run.
struct configuration_runs {
  std::vector<double> predicted[2];         ///< [0]: in-process, [1]: --workers; after the warm-up
  std::vector<double> predicted_before[2];  ///< by the calibration just before each run alone
  std::vector<double> predicted_after[2];   ///< by the one just after it alone
  std::vector<double> measured[2];
  std::vector<double> whole_predicted[2];  ///< over the whole run
  std::vector<double> whole_measured[2];
  std::vector<double> cpu_us_per_sample[2];
  std::vector<double> kernel_fraction[2];
};

/// Which configuration, and where it ran, a row is.
struct validation_row {
  std::string mode;
  int stages = 1;
  int replicas = 1;
  int workers = 0;  ///< worker processes; 0: in one process
};

/// The table as it grows, row by row, and what its footnotes count.
class validation_table {
 public:
  /// `warm_up_steps`: the first steps of every run, which neither side's samples/s counts;
  /// `replicated`: a replicas column; `expected_rows`: for the line said as each row ends.
  validation_table(int64_t warm_up_steps, bool replicated, size_t expected_rows);

  /// Adds the row's figures from the runs of its column, and says so on stderr.
  void add_row(const validation_row& row, const configuration_runs& result);
  /// A line printed under the table.
  void add_note(std::string note) { notes_.push_back(std::move(note)); }
  /// The table, its footnotes and its notes on stdout; `runs`: real runs per row.
  void print(int runs) const;
  /// The rows as validation.json holds them.
  const nlohmann::json& rows() const { return rows_; }

 private:
  int64_t warm_up_steps_;
  bool replicated_;
  size_t expected_rows_;
  nlohmann::json rows_ = nlohmann::json::array();
  std::vector<std::string> lines_;
  std::vector<std::string> notes_;
  size_t within_rows_ = 0;      ///< rows whose error is within 10 %
  size_t unresolved_rows_ = 0;  ///< the others whose error the machine's own drift could explain
};

}  // namespace troupe::apps
