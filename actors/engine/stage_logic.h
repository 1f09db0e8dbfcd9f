#pragma once

// One stage's behaviour as a state machine: a key message comes in, device work runs through
// the stage_device, and what must be sent on comes out. No threads, clocks or sockets, so the
// real host and the simulator drive the very same code.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "actors/engine/pass_order.h"
#include "actors/engine/pipeline_messages.h"
#include "actors/engine/ring_all_reduce.h"
#include "actors/engine/stage_device.h"

namespace troupe::actors {

struct stage_settings {
  int index = 0;
  int count = 1;
  /// Optimizer step after the backward passes of this many keys.
  int min_update_interval = 1;
  /// Backward uses the weights its forward used (PipeDream).
  bool weight_stashing = false;
  /// PipeMare's learning-rate rescheduling (Yang et al. 2021) over this many steps (0: off):
  /// step k runs at learning_rate(k) · τ^-(1 − min(k / K, 1)), τ the mean staleness of the
  /// keys whose gradients it applies, at least 1. A stage whose keys are never stale (τ = 1)
  /// steps as without it.
  int64_t pipemare_warmup_steps = 0;
  /// Weight prediction (SpecTrain, Chen et al. 2018): a key's forward and backward passes both
  /// run on w − d · lr · b, the weights moved d steps ahead along the momentum buffer b, d the
  /// stage's delay (the mean staleness of its last step's keys). A stage whose keys are never
  /// stale (d = 0) runs on its weights as they are.
  bool predict_weights = false;
  /// The delay-corrected Nesterov method (Ajanthan et al., ICML 2025, as its authors' code
  /// runs it): SGD with Nesterov's look-ahead, whose momentum grows with the stage's delay d
  /// (the mean staleness of the keys a step applies), μ_d = μ + min(d, S) · (0.99 − μ) / S for
  /// S stages, the step's gradient weighed by (1 − μ_d) / (1 − μ) (as raising β1 does in the
  /// authors' NAdam), so the delayed stages lean on the look-ahead more at the same long-run
  /// step. This is μ (> 0: on; 0: off). A stage whose keys are never stale steps as SGD with
  /// Nesterov momentum μ. With Adam it is β1, raised alike, and the stage steps as NAdam (the
  /// authors' own optimizer): Adam's moving average needs no weighing.
  double nesterov_momentum = 0;
  /// Multiplies the last stage's loss gradient: 1 / (samples per key × min_update_interval),
  /// so one step applies the mean gradient of the samples it saw.
  float gradient_scale = 1.0f;
  /// The same for a dynamic model's key (model.nodes), whose rows (parts or instances) vary
  /// from key to key: 1 / (min_update_interval × replicas), divided by the key's rows, so one
  /// step applies the mean over its keys of each key's mean gradient.
  float key_gradient_scale = 1.0f;
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
  /// The optimizer step runs once the step's last input gradient has gone on (the host's
  /// run_ready_work(), or before the next pass, whichever comes first), beside the earlier
  /// stages' backward passes instead of before them: in sync mode, where they wait for it.
  /// Otherwise (async, where a step per key keeps the stages busy) it runs within the pass.
  bool step_after_sending = false;
  /// Schedules with a fixed order of passes (ZB-H1, interleaved): the order of the worker
  /// that hosts this stage, shared by the stages it hosts (pass_order.h). A forward or backward
  /// message that comes before its turn waits in the stage; under ZB-H1 a backward pass
  /// computes the input gradient (B) and defers the weight gradients (W) to where the order
  /// puts them. Null: passes run as messages come, and a backward pass is whole.
  std::shared_ptr<pass_turn> turn;
  /// 1F1B and its descendants: most keys between their forward and their backward pass here
  /// (stages − index), so that a stage takes the next forward only after a backward, as the
  /// schedule orders its work; 0: any number (GPipe, async).
  int max_forward_keys = 0;
  /// Data parallelism: this stage is stage `index` of replica `replica` of `replicas` copies
  /// of the pipeline. With several, a step's gradients are summed with the same stage of the
  /// other replicas (a ring all-reduce whose chunks travel as reduce messages) before the
  /// stage steps; until then it takes no forward or evaluation.
  int replicas = 1;
  int replica = 0;
  /// Async mode with replicas: every this many of its steps the stage averages its weights
  /// with the same stage of the other replicas, by a ring all-reduce that runs while it goes
  /// on training; once the sum is in, the stage moves to the average plus what it has learnt
  /// since it sent its weights. 0: the replicas sum gradients instead (sync mode).
  int64_t replica_sync_interval = 0;
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
    return !reducing() &&
           (settings_.max_forward_keys <= 0 ||
            forward_versions_.size() < static_cast<size_t>(settings_.max_forward_keys));
  }
  /// The step's gradients are being summed with the other replicas: the step waits for the
  /// sum, and a host keeps forwards, evaluations and state requests waiting until it is taken.
  bool reducing() const { return reduction_pending_; }
  /// All-reduces finished so far.
  int64_t reductions() const {
    return replica_group_ ? group_rounds_ : ring_ ? ring_->rounds() : 0;
  }
  /// Replicas that sum on their devices (`parallelism.collective` "nccl" or "shared_memory"):
  /// the stage's rank among its peers, which replaces the ring. Its collectives block or queue
  /// on the device where the ring would send chunks, at the same points of the step.
  void use_replica_group(std::shared_ptr<layers::device_group> group);
  /// An all-reduce with the replicas is under way or waits to start (the stage's state is not
  /// final until it ends): a host answers state requests and reports after it.
  bool settling() const {
    return reduction_pending_ || averages_due_ > 0 || (ring_ && ring_->under_way());
  }
  /// Async replicas: count of steps by how many versions the stage was ahead of the slowest
  /// replica (as the coordinator last told it: an upper bound of the true lead).
  const std::vector<int64_t>& replica_staleness_histogram() const { return replica_staleness_; }
  /// The stage's optimizer step is due (its step's backward passes are done and their input
  /// gradients returned), or the worker's next pass is this stage's and can run: a W, or a
  /// message that came before its turn. The host calls run_ready_work() after it has sent what the
  /// last call returned (so that a B's input gradient leaves before the W behind it runs), and
  /// tells the stage whose pass is next when another stage of the worker moved the turn on.
  bool has_ready_work() const;
  /// The stage whose pass the worker runs next; -1 without a fixed order.
  int stage_with_next_pass() const { return ordered() ? settings_.turn->next_pass().stage : -1; }
  /// Runs the next pass (and the optimizer step after the step's last W); what to send comes
  /// out, as from handle(). Nothing when none is ready.
  std::vector<stage_output> run_ready_work();
  /// Runs every deferred W and the step they wait for (before reading the weights or the
  /// version at the end of a run).
  void finish_deferred_step();

  bool is_last() const { return settings_.index + 1 == settings_.count; }
  /// The stage's place in its pipeline (its replica's).
  int stage_index() const { return settings_.index; }
  /// Weight version: optimizer steps taken so far.
  int64_t version() const { return version_; }
  /// Count of backward passes by staleness (version at backward − version at forward).
  const std::vector<int64_t>& staleness_histogram() const { return staleness_; }
  /// The same for the weights the backward pass actually used (all 0 with weight stashing).
  const std::vector<int64_t>& weight_staleness_histogram() const { return weight_staleness_; }
  /// Most forward contexts held at once.
  size_t peak_contexts() const { return peak_contexts_; }
  /// The keys whose forward pass ran here and whose backward pass has not, in key order.
  void keys_held(std::vector<int64_t>* keys) const;

  /// Everything needed to continue from here (for a checkpoint; no key may be in flight).
  stage_state save_state();
  /// Continues from `state`: every key in flight is forgotten, and so is a step under way (held
  /// for the clipping total, summed with the replicas, waiting for deferred W). With
  /// `weights_only` only the weights are taken (initial weights from a file) and the version
  /// stays. False, with `error` set and nothing changed, when the state belongs to another
  /// stage or model.
  bool load_state(const stage_state& state, bool weights_only, std::string* error);

 private:
  void forward(const key_message& message, std::vector<stage_output>* outputs);
  void evaluate(const key_message& message, std::vector<stage_output>* outputs);
  void backward(key_message message, std::vector<stage_output>* outputs);
  /// Counts a backward pass; true when it completes a step's worth (min_update_interval).
  bool count_backward();
  /// The device's backward pass: whole, or its B half with W deferred.
  layers::tensor run_backward(const key_message& message);
  /// Runs a forward or backward message.
  void run_pass(const key_message& message, std::vector<stage_output>* outputs);
  /// The oldest deferred W, and the step after the step's last one.
  void run_weight_gradients();
  /// Runs every deferred W.
  void run_all_deferred();
  /// Whether the worker's next pass is this stage's pass of `kind` for `micro_batch`.
  bool is_next_pass(scheduled_pass::kind kind, int micro_batch) const;
  /// The pass a backward message asks for: B under ZB-H1, the whole backward otherwise.
  scheduled_pass::kind backward_pass() const;
  /// The pass a forward or backward message asks for, and its micro-batch.
  scheduled_pass::kind pass_of(const key_message& message) const;
  int micro_batch_of(const key_message& message) const {
    return static_cast<int>(message.key % settings_.min_update_interval);
  }
  bool ordered() const { return settings_.turn != nullptr; }
  /// Whether a last stage's labels are all classes its loss can score (or ignored_label): a
  /// peer's label out of range would index past a row of logits. `error` says which is not.
  bool labels_fit(const key_message& message, std::string* error) const;
  /// The step's backward passes and deferred W are done and the step is not taken yet.
  bool step_due() const { return step_after_deferred_ && deferred_.empty(); }
  /// Takes the optimizer step, its gradients clipped to the norm sqrt(norm_squared).
  void take_step(double norm_squared);
  /// The learning rate of the step from version_ (with PipeMare's rescheduling).
  double step_learning_rate() const;
  /// The momentum of the coming step (stage_settings::nesterov_momentum), or -1: the job's.
  double step_momentum() const;
  void handle_step_message(const key_message& message, std::vector<stage_output>* outputs);
  /// Global clipping: the step's gradients are complete (and summed over the replicas): stage
  /// 0 steps and tells the next; a later stage passes its norm on and holds its step.
  void step_with_global_norm(key_message message, std::vector<stage_output>* outputs);
  bool replicated() const { return settings_.replicas > 1; }
  /// A fresh ring with the stage's replicas (no round under way).
  std::unique_ptr<ring_all_reduce> make_ring() const;
  /// Begins the all-reduce of the step's gradients.
  void start_reduction(std::vector<stage_output>* outputs);
  /// A chunk of the ring from the previous replica.
  void handle_reduce(const key_message& message, std::vector<stage_output>* outputs,
                     std::string* refusal);
  void send_chunks(const std::vector<ring_chunk>& chunks, std::vector<stage_output>* outputs);
  /// The sum is in: the step is taken (or, with global clipping, its norm goes on).
  void finish_reduction(std::vector<stage_output>* outputs);
  bool averaging() const { return settings_.replicas > 1 && settings_.replica_sync_interval > 0; }
  /// Async replicas, after a step: its lead over the slowest replica is counted, and every
  /// replica_sync_interval steps a weight average begins (or waits for the one under way).
  void after_replica_step(std::vector<stage_output>* outputs);
  void start_average(std::vector<stage_output>* outputs);
  /// The replicas' weight sum is in: the weights move to its mean plus the stage's own
  /// progress since it sent them.
  void finish_average(std::vector<stage_output>* outputs);
  static void record(std::vector<int64_t>* histogram, int64_t value);

  stage_settings settings_;
  stage_device& device_;
  int64_t version_ = 0;
  int64_t keys_since_step_ = 0;
  int64_t staleness_since_step_ = 0;  ///< summed over the keys of the step under way
  double delay_ = 0;                  ///< mean staleness of the last step's keys
  /// Weight prediction: the versions whose predicted weights are stashed.
  std::set<int64_t> predicted_versions_;
  /// Global clipping: a step is held until the step message with the total norm arrives.
  bool step_pending_ = false;
  /// The step's backward passes are done; the step follows (after zero-bubble's deferred W).
  bool step_after_deferred_ = false;
  std::unordered_map<uint64_t, int64_t> forward_versions_;
  /// Keys whose W is deferred, oldest first (the order W would have run in, so the weight
  /// gradients sum in the same order as without deferral).
  std::deque<uint64_t> deferred_;
  /// Messages that came before their turn, by pass kind and micro-batch.
  std::map<std::pair<int, int>, key_message> early_;
  std::vector<int64_t> staleness_;
  std::vector<int64_t> weight_staleness_;
  size_t peak_contexts_ = 0;
  int64_t refused_ = 0;
  /// Replicas: the ring among this stage's peers, and whether a step waits for its sum.
  std::unique_ptr<ring_all_reduce> ring_;
  std::shared_ptr<layers::device_group> replica_group_;
  int64_t group_rounds_ = 0;
  bool reduction_pending_ = false;
  /// Global clipping with replicas: the step's last backward message, until the sum is in.
  std::optional<key_message> held_for_clipping_;
  /// Async replicas: the weights sent into the average under way, the averages due after it
  /// (every stage takes part in every round, in order), the newest replica floor heard, and
  /// the lead histogram.
  std::vector<float> sent_weights_;
  int64_t averages_due_ = 0;
  /// Host memory for the gradients or weights of an all-reduce, kept from one to the next.
  std::vector<float> scratch_;
  int64_t replica_floor_ = 0;
  std::vector<int64_t> replica_staleness_;
};

}  // namespace troupe::actors
