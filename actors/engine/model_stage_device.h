#pragma once

// What every stage device that holds real weights shares, whatever runs its passes (a chain of
// blocks, a graph's nodes): the stream, the optimizer, stashed weight versions, the loss, and
// saving and loading the stage's state by parameter name.
//
// All of its work goes to a stream of its own, so that stages sharing a GPU (in one process,
// or as separate backends on one device) run side by side. Every method synchronizes that
// stream before it returns (see stage_device.h), which is what makes handing its tensors to
// anyone else safe on CUDA, where streams are not ordered with each other:
// - a returned activation or gradient is read by the wire encoder (on the backend's default
//   stream) or, in a local pipeline, by the next stage on that stage's stream;
// - parameters are read by snapshots and checkpoints on whatever stream the reader has;
// - tensors freed during a call (temporaries, contexts) go back to the backend's pool at once
//   (CUDA frees on a stream of its own), and another stream of the same backend may be handed
//   that memory next; once the call has synchronized, no kernel still uses it.
// On the CPU every operation has finished when it returns, so the synchronizations cost
// nothing there.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/engine/stage_device.h"
#include "layers/layer.h"
#include "layers/optimizer.h"

namespace troupe::actors {

class model_stage_device : public stage_device {
 public:
  /// The weights, contexts and stashes are freed after this, with no work left that uses them.
  ~model_stage_device() override;
  model_stage_device(const model_stage_device&) = delete;
  model_stage_device& operator=(const model_stage_device&) = delete;

  loss_result loss(const layers::tensor& logits, const std::vector<int32_t>& labels, float scale,
                   bool want_gradient) override;
  double squared_gradient_norm() override;
  void step(float learning_rate, float gradient_scale, float momentum) override;
  void stash_weights(int64_t version) override;
  void stash_predicted_weights(int64_t version, float distance) override;
  void use_weights(int64_t version) override { next_pass_version_ = version; }
  void release_weights_before(int64_t version) override;
  int64_t peak_activation_bytes() const override;
  std::vector<layers::parameter*> parameters() override { return parameters_; }
  stage_state save_state() override;
  bool load_state(const stage_state& state, bool weights_only, std::string* error) override;

 protected:
  /// Work goes to a fresh stream of `device` whose GEMMs run at the job's precision.
  model_stage_device(const job_config& config, stage_range range, layers::backend& device);

  /// Takes the stage's parameters (and their names, "linear2.weight"), builds the optimizer
  /// over them and notes the memory the stage holds at rest; the derived constructor calls it
  /// once its model is built.
  void adopt_parameters(std::vector<layers::parameter*> parameters, std::vector<std::string> names,
                        const job_config& config);
  /// Drops every forward context and deferred weight gradient (a state was loaded).
  virtual void forget_keys() = 0;

  layers::run_options options_for(const key_message& message, bool training) const;
  /// Puts the stashed weights of the version named by use_weights() in place; returns the
  /// current ones to restore (empty when nothing was swapped).
  std::vector<layers::tensor> swap_in_stashed_weights();
  void restore(const std::vector<layers::tensor>& current);
  /// Evaluation passes are larger than training keys: their temporaries stay out of the
  /// training peak. Call before and after one.
  void begin_evaluation_pass();
  void end_evaluation_pass() { device_.reset_peak_bytes(); }

  layers::backend& device_;
  layers::stream stream_;
  uint64_t seed_;
  stage_range range_;
  int stages_;
  bool recompute_;
  int64_t next_pass_version_ = -1;

 private:
  const char* optimizer_suffix(size_t k) const;
  size_t index_of(const std::string& name) const;
  /// Pairs every parameter with its tensor in `tensors` (all of them must be there with
  /// their shapes, and nothing else).
  bool match_weights(const std::vector<named_tensor>& tensors, std::string* error,
                     std::vector<std::pair<const named_tensor*, layers::tensor*>>* copies);
  /// The copies of the gradients and optimizer tensors of `state`, and which parameters have a
  /// gradient; false with `error` naming the first that does not fit.
  bool match_training_state(const stage_state& state, std::vector<bool>* has_gradient,
                            std::string* error,
                            std::vector<std::pair<const named_tensor*, layers::tensor*>>* copies);

  int64_t resting_bytes_ = 0;  ///< weights, gradients and optimizer state
  int64_t training_peak_ = 0;  ///< the backend's peak bytes outside evaluation passes
  std::vector<layers::parameter*> parameters_;
  std::vector<std::string> names_;  ///< "linear2.weight", parallel to parameters_
  std::unique_ptr<layers::optimizer> optimizer_;
  std::map<int64_t, std::vector<layers::tensor>> stash_;
};

}  // namespace troupe::actors
