#include "actors/engine/checkpoint_round.h"

#include <utility>

namespace troupe::actors {

checkpoint_round::checkpoint_round(int stages) : stages_(stages) {}

bool checkpoint_round::begin(purpose what, int64_t step, double now_s) {
  if (under_way_) return false;
  under_way_ = true;
  purpose_ = what;
  step_ = step;
  started_s_ = now_s;
  awaiting_ = stages_;
  answered_.assign(static_cast<size_t>(stages_), false);
  states_.assign(static_cast<size_t>(stages_), std::string());
  return true;
}

std::optional<int64_t> checkpoint_round::begin_if_due(const training_run& run, double now_s) {
  const std::optional<int64_t> due = run.checkpoint_due();
  if (!due || !begin(purpose::save, *due, now_s)) return std::nullopt;
  return due;
}

checkpoint_round::arrival checkpoint_round::arrive(int stage, std::string state,
                                                   std::string* problem) {
  if (!under_way_ || stage < 0 || stage >= stages_ || answered_[static_cast<size_t>(stage)]) {
    *problem = "an unexpected state message from stage " + std::to_string(stage);
    return arrival::refused;
  }
  if (purpose_ == purpose::save && state.empty()) {
    *problem = "stage " + std::to_string(stage) + " sent an empty shard";
    abandon();
    return arrival::refused;
  }
  answered_[static_cast<size_t>(stage)] = true;
  states_[static_cast<size_t>(stage)] = std::move(state);
  if (--awaiting_ > 0) return arrival::waiting;
  under_way_ = false;
  return arrival::complete;
}

std::vector<std::string> checkpoint_round::take_states() {
  if (purpose_ == purpose::load) states_.clear();
  return std::move(states_);
}

void checkpoint_round::abandon() {
  under_way_ = false;
  states_.clear();
}

}  // namespace troupe::actors
