#pragma once

// How a run reports to the person watching it: a progress bar redrawn in place when stderr is
// a terminal, plain log lines otherwise (CI, files, pipes); metrics.jsonl either way.

#include <chrono>
#include <cstdio>

#include "actors/engine/run_monitor.h"
#include "actors/engine/run_reports.h"
#include "actors/hosts/steady_clock.h"
#include "apps/cli/run_output.h"

namespace troupe::apps {

/// The monotonic wall clock of a real run.
using steady_clock_source = actors::steady_clock;

class run_reporter final : public actors::training_observer {
 public:
  /// `log` may be null (no metrics file). `interactive`: draw a progress bar on `terminal`.
  run_reporter(metrics_log* log, std::FILE* terminal, bool interactive, int64_t steps_per_epoch,
               int64_t epochs);

  void on_step(int64_t step, int64_t total_steps, int64_t epoch, double loss,
               double samples_per_s) override;
  void on_metrics(const actors::metrics_record& record) override;
  void on_event(const nlohmann::json& event) override;
  /// Also hands what the run reports to `monitor` (the dashboard's and stall watch's view).
  void show_on(actors::run_monitor* monitor) { monitor_ = monitor; }

 private:
  void draw_bar(int64_t step, int64_t total_steps, int64_t epoch);
  void clear_bar();

  metrics_log* log_;
  actors::run_monitor* monitor_ = nullptr;
  std::FILE* terminal_;
  bool interactive_;
  int64_t steps_per_epoch_;
  int64_t epochs_;
  double smoothed_loss_ = 0;
  double smoothed_rate_ = 0;
  bool bar_drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace troupe::apps
