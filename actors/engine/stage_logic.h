#pragma once

// One stage's behaviour as a state machine: a key message comes in, device work runs through
// the stage_device, and what must be sent on comes out. No threads, clocks or sockets, so the
// real host and the simulator drive the very same code.

#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_map>
#include <vector>

#include "actors/engine/pipeline_messages.h"
#include "actors/engine/stage_device.h"

namespace troupe::actors {

struct stage_settings {
  int index = 0;
  int count = 1;
  /// Optimizer step after the backward passes of this many keys.
  int min_update_interval = 1;
  /// Backward uses the weights its forward used (PipeDream).
  bool weight_stashing = false;
  /// Multiplies the last stage's loss gradient: 1 / (samples per key × min_update_interval),
  /// so one step applies the mean gradient of the samples it saw.
  float gradient_scale = 1.0f;
  /// Learning rate of the step that produces weight version v + 1 from version v.
  std::function<double(int64_t)> learning_rate = [](int64_t) { return 0.01; };
  /// Scales a step's gradients down to this L2 norm when larger (0: no clipping).
  double clip_norm = 0;
  /// Clip by the norm of every stage's gradients together (sync mode, several stages): the
  /// step's last backward message carries the later stages' squared norms to stage 0, which
  /// steps and sends a step message forward carrying the total; the later stages hold their
  /// step until it arrives, and the last stage retires the step's last key then, so the
  /// coordinator sees the step finished only once every stage has taken it. Otherwise each
  /// stage clips by its own norm.
  bool global_clipping = false;
  /// Zero-bubble schedules (ZB-H1): a backward pass computes the input gradient (B) at once and
  /// defers the weight gradients (W) to run_deferred_work(), which the host calls when the
  /// stage would otherwise wait. Keys between their forward and their W at this stage stay
  /// within this many (ZB-H1: stages − index + 1, 1F1B's plus one); 0: no deferral.
  int max_held_keys = 0;
  /// 1F1B and its descendants: most keys between their forward and their backward pass here
  /// (stages − index), so that a stage takes the next forward only after a backward, as the
  /// schedule orders its work; 0: any number (GPipe, async).
  int max_forward_keys = 0;
};

class stage_logic {
 public:
  /// `device` must outlive the logic.
  stage_logic(stage_settings settings, stage_device& device);

  /// Handles one forward, evaluate or backward message for this stage. A message that does not
  /// fit (wrong shape, unknown key, missing labels) changes nothing: it is counted, the reason
  /// goes to `refusal` when given, and nothing comes out.
  std::vector<stage_output> handle(const key_message& message, std::string* refusal = nullptr);
  /// Messages refused so far.
  int64_t refused() const { return refused_; }
  /// Whether a forward message may be handled now (max_forward_keys). A host keeps a forward
  /// that may not waiting, and hands it over after a backward message has been handled.
  bool ready_for_forward() const {
    return settings_.max_forward_keys <= 0 ||
           forward_versions_.size() < static_cast<size_t>(settings_.max_forward_keys);
  }
  /// Deferred weight-gradient work waits (zero-bubble schedules): the host should call
  /// run_deferred_work() when no message is waiting for this stage, so that W fills time the
  /// stage would otherwise wait; a W also runs in front of a forward when the stage holds
  /// max_held_keys keys.
  bool has_deferred_work() const { return !deferred_.empty(); }
  /// Runs the oldest deferred W, and the optimizer step after the last one when the step's
  /// backward passes are all done; nothing to send comes of it. False when none waited.
  bool run_deferred_work();
  /// Runs every deferred W and the step they wait for (before reading the weights or the
  /// version at the end of a run).
  void finish_deferred_step();

  bool is_last() const { return settings_.index + 1 == settings_.count; }
  /// Weight version: optimizer steps taken so far.
  int64_t version() const { return version_; }
  /// Count of backward passes by staleness (version at backward − version at forward).
  const std::vector<int64_t>& staleness_histogram() const { return staleness_; }
  /// The same for the weights the backward pass actually used (all 0 with weight stashing).
  const std::vector<int64_t>& weight_staleness_histogram() const { return weight_staleness_; }
  /// Most forward contexts held at once.
  size_t peak_contexts() const { return peak_contexts_; }

  /// Everything needed to continue from here (for a checkpoint; no key may be in flight).
  stage_state save_state();
  /// Continues from `state` (every key in flight is forgotten). With `weights_only` only the
  /// weights are taken (initial weights from a file) and the version stays. False, with
  /// `error` set and nothing changed, when the state belongs to another stage or model.
  bool load_state(const stage_state& state, bool weights_only, std::string* error);

 private:
  void forward(const key_message& message, std::vector<stage_output>* outputs);
  void evaluate(const key_message& message, std::vector<stage_output>* outputs);
  void backward(key_message message, std::vector<stage_output>* outputs);
  /// Counts a backward pass; true when it completes a step's worth (min_update_interval).
  bool count_backward();
  /// The device's backward pass: whole, or its B half with W deferred.
  layers::tensor run_backward(const key_message& message);
  /// Runs deferred W until at most `keys` keys are held here (every one with 0).
  void run_deferred_until(size_t keys);
  /// Takes the optimizer step, its gradients clipped to the norm sqrt(norm_squared).
  void take_step(double norm_squared);
  void handle_step_message(const key_message& message, std::vector<stage_output>* outputs);
  static void record(std::vector<int64_t>* histogram, int64_t value);

  stage_settings settings_;
  stage_device& device_;
  int64_t version_ = 0;
  int64_t keys_since_step_ = 0;
  /// Global clipping: a step is held until the step message with the total norm arrives.
  bool step_pending_ = false;
  /// Zero-bubble: the step's backward passes are done; the step follows the deferred W.
  bool step_after_deferred_ = false;
  std::unordered_map<uint64_t, int64_t> forward_versions_;
  /// Keys whose W is deferred, oldest first (the order W would have run in, so the weight
  /// gradients sum in the same order as without deferral).
  std::deque<uint64_t> deferred_;
  std::vector<int64_t> staleness_;
  std::vector<int64_t> weight_staleness_;
  size_t peak_contexts_ = 0;
  int64_t refused_ = 0;
};

}  // namespace troupe::actors
