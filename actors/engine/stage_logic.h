#pragma once

// One stage's behaviour as a state machine: a key message comes in, device work runs through
// the stage_device, and what must be sent on comes out. No threads, clocks or sockets, so the
// real host and the simulator drive the very same code.

#include <cstdint>
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
  std::unordered_map<uint64_t, int64_t> forward_versions_;
  std::vector<int64_t> staleness_;
  std::vector<int64_t> weight_staleness_;
  size_t peak_contexts_ = 0;
  int64_t refused_ = 0;
};

}  // namespace troupe::actors
