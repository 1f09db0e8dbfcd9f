#pragma once

// The coordinator's rounds with every stage, as a state machine without I/O (FoundationDB's
// lesson): a save round, once training_run has paused the run at a step boundary and drained
// it, collects every stage's state for the checkpoint; a load round has every stage load its
// shard before the first key. The CAF host and the simulator drive the same machine; they
// differ only in how they ask the stages and where the states go.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine/training_run.h"

namespace troupe::actors {

class checkpoint_round {
 public:
  enum class purpose { save, load };
  enum class arrival { waiting, complete, refused };

  /// Rounds over `stages` stages.
  explicit checkpoint_round(int stages);

  /// Begins a round in which every stage answers once; false when one is under way.
  bool begin(purpose what, int64_t step, double now_s);
  /// Begins a save round when `run` has a checkpoint due and no round is under way: the step
  /// the stages must save, or nothing.
  std::optional<int64_t> begin_if_due(const training_run& run, double now_s);

  /// Stage `stage`'s answer: its state (save rounds, never empty) or an acknowledgement (load
  /// rounds, empty). complete when every stage has answered: take_states() then holds the states
  /// in stage order. refused, with `problem`, when no round waits for it (none under way, an
  /// unknown stage, a second answer) or a saved state is empty; a refusal while a round is under
  /// way ends it.
  arrival arrive(int stage, std::string state, std::string* problem);
  /// The states of the round that just completed, in stage order (empty for load rounds).
  std::vector<std::string> take_states();
  /// Ends a round under way without completing it (a stage failed, a worker was lost).
  void abandon();

  bool under_way() const { return under_way_; }
  purpose current() const { return purpose_; }
  int64_t step() const { return step_; }
  /// When the current (or last) round began, on the host's clock.
  double started_s() const { return started_s_; }

 private:
  int stages_;
  bool under_way_ = false;
  purpose purpose_ = purpose::save;
  int64_t step_ = 0;
  double started_s_ = 0;
  int awaiting_ = 0;
  std::vector<bool> answered_;
  std::vector<std::string> states_;
};

}  // namespace troupe::actors
