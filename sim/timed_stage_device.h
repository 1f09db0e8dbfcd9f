#pragma once

// A stage's device work in virtual time: every call is charged its cost model's seconds, and
// either really runs on an inner device (numerics mode) or only produces tensors of the right
// shapes on the shape backend (timing-only mode). The host takes the charge after each
// message the stage logic handles, and keeps the device busy that long. A stage of a model
// graph's nodes is charged per key by the visits its instances' routes make (graph_cost.h).

#include <map>
#include <memory>
#include <optional>
#include <set>

#include "actors/engine/stage_device.h"
#include "sim/cost_model.h"
#include "sim/graph_cost.h"

namespace troupe::sim {

class timed_stage_device final : public actors::stage_device {
 public:
  /// `input` and `output` are the stage's per-sample shapes. With `numerics` the math runs
  /// there; without, tensors carry shapes only.
  timed_stage_device(stage_cost cost, layers::shape input, layers::shape output,
                     std::unique_ptr<actors::stage_device> numerics);
  /// A stage of a model graph's nodes: `graph` charges each key's passes, `cost` (their blocks)
  /// the rest (steps' memory, parameter copies).
  timed_stage_device(stage_cost cost, graph_stage_cost graph,
                     std::unique_ptr<actors::stage_device> numerics);

  /// Seconds charged since the last call.
  double take_charge();
  /// Most bytes held at once: state, forward contexts and stashed weights.
  double peak_bytes() const { return peak_bytes_; }
  const stage_cost& cost() const { return cost_; }
  /// The graph's cost model of a stage of a model graph, else null.
  const graph_stage_cost* graph_cost() const { return graph_ ? &*graph_ : nullptr; }

  bool accepts(const actors::key_message& message, std::string* error) const override;
  layers::tensor forward(const actors::key_message& message, bool training) override;
  actors::loss_result loss(const layers::tensor& logits, const std::vector<int32_t>& labels,
                           float scale, bool want_gradient) override;
  layers::tensor backward(const actors::key_message& message, bool need_input_gradient) override;
  layers::tensor backward_input(const actors::key_message& message,
                                bool need_input_gradient) override;
  void backward_weights(uint64_t key) override;
  double squared_gradient_norm() override;
  void step(float learning_rate, float gradient_scale, float momentum) override;
  void stash_weights(int64_t version) override;
  void stash_predicted_weights(int64_t version, float distance) override;
  void use_weights(int64_t version) override;
  void release_weights_before(int64_t version) override;
  size_t held_contexts() const override;
  std::vector<layers::parameter*> parameters() override;
  /// The stage's replicas sum through shared memory (`ranks` of them), in place: a sum is
  /// charged as that group's memory traffic over the values instead of the ring's copies.
  void sum_in_shared_memory(int ranks) { shared_memory_ranks_ = ranks; }
  /// Without numerics: sizes only (the replicas' all-reduce carries the parameters' count).
  /// Reading the stage's gradients or weights is charged as a copy of them, and writing the
  /// sum back as the copies the all-reduce made of them in between.
  bool holds_values() const override { return numerics_ != nullptr; }
  void read_gradient_values(std::vector<float>* values) override;
  void set_gradient_values(const std::vector<float>& values) override;
  int64_t gradient_value_count() override;
  void read_weight_values(std::vector<float>* values) override;
  void set_weight_values(const std::vector<float>& values) override;
  int64_t weight_value_count() override;
  actors::stage_state save_state() override;
  bool load_state(const actors::stage_state& state, bool weights_only, std::string* error) override;

 private:
  layers::tensor shaped(int64_t batch, const layers::shape& per_sample) const;
  /// A graph stage's forward (timing only: its output rows) and backward (its input rows).
  layers::tensor graph_forward(const actors::key_message& message, bool training);
  layers::tensor graph_backward(const actors::key_message& message, bool need_input_gradient);
  /// Forgets a key's forward context (its backward has run).
  void release_context(uint64_t key);
  /// A shared-memory group's sum (or `average`) of the stage's values, in parameter copies.
  double shared_memory_copies(bool average) const;
  void note_memory();

  stage_cost cost_;
  std::optional<graph_stage_cost> graph_;
  layers::shape input_;
  layers::shape output_;
  std::unique_ptr<actors::stage_device> numerics_;
  double charge_s_ = 0;
  std::map<uint64_t, int64_t> contexts_;         ///< key -> batch, between forward and backward
  std::map<uint64_t, int64_t> pending_weights_;  ///< key -> batch, between B and W
  int64_t context_samples_ = 0;
  std::set<int64_t> stashed_;  ///< versions whose weights are stashed
  double peak_bytes_ = 0;
  int shared_memory_ranks_ = 0;  ///< 0: the replicas sum over the ring
};

}  // namespace troupe::sim
