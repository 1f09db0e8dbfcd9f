#pragma once

// Recovery from a lost worker as a state machine without I/O: the restart budget
// (checkpoint.max_restarts), whether a recovery is under way and since when, and the events both
// hosts report (worker_lost, recovered). The cluster coordinator and the simulator drive it; they
// differ only in how they reset the stages, replace the worker and load the checkpoint.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace troupe::actors {

class recovery {
 public:
  /// At most `max_restarts` restarts in a run.
  explicit recovery(int max_restarts) : limit_(max_restarts) {}

  /// A worker hosting `stages` was lost at `now_s`; `who` is an object of the host's fields
  /// naming it (address, device...). True when the budget allows a restart: it is counted, a
  /// recovery is under way, and `event` is the worker_lost event to report. False when the
  /// budget is spent: `reason` says so ("after N restarts (checkpoint.max_restarts = L)").
  bool lost(const nlohmann::json& who, const nlohmann::json& stages, double now_s,
            nlohmann::json* event, std::string* reason);
  /// Every stage has loaded the checkpoint of `step` (0: the initial weights) at `now_s`: the
  /// recovery is over; returns the recovered event.
  nlohmann::json recovered(int64_t step, double now_s);

  int restarts() const { return restarts_; }
  int limit() const { return limit_; }
  bool under_way() const { return under_way_; }
  /// When the recovery under way began: the first loss since training last ran.
  double lost_at_s() const { return lost_at_s_; }

 private:
  int limit_;
  int restarts_ = 0;
  bool under_way_ = false;
  double lost_at_s_ = 0;
};

}  // namespace troupe::actors
