#pragma once

// What a stage's device work costs in virtual time. The roofline model counts, per block of
// the stage, the floating-point operations and the bytes that a forward pass, a backward
// pass, the loss and an optimizer step move, and charges each kernel
//   max(flops / (peak_flops × efficiency), bytes / (memory_bandwidth × efficiency))
// plus the device's launch overhead. Work scales with the key's batch; weights are read once
// per kernel whatever the batch.

#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/partition.h"
#include "sim/cluster_model.h"
#include "sim/profile.h"

namespace troupe::sim {

/// Operations and bytes of one kernel or of a group of kernels.
struct kernel_work {
  double flops_per_sample = 0;
  double bytes_per_sample = 0;
  double fixed_bytes = 0;  ///< independent of the batch (weights, gradients)
  int kernels = 0;
};

/// One block's work.
struct block_work {
  std::string type;
  kernel_work forward;
  kernel_work backward_weights;  ///< weight and bias gradients
  kernel_work backward_input;    ///< the gradient of the block's input
  kernel_work step;              ///< the optimizer over the block's parameters
  kernel_work stash;             ///< a copy of the weights (asynchronous weight stashing)
  int64_t output_elements = 0;   ///< per sample
  /// The block's memory, as actors::memory_of_block() estimates it for the real engine.
  int64_t parameters = 0;
  double state_bytes = 0;        ///< weights, gradients and optimizer state
  int64_t context_elements = 0;  ///< floats per sample kept from forward to backward
};

/// The costs of one stage's blocks on one device.
class stage_cost {
 public:
  stage_cost(std::vector<block_work> blocks, kernel_work loss, device_model device);
  /// Times measured on this machine (`profile` blocks of this stage, the same count as
  /// `blocks`, which still give the memory figures); `last` charges the profile's loss.
  /// `evaluation_batch` is the batch of the blocks' evaluate_s (0: none measured).
  void use_measured(std::vector<block_profile> measured, int64_t batch, double loss_s,
                    int64_t evaluation_batch = 0);

  /// Forward of a training key (`training`) or an evaluation key.
  double forward_s(int64_t batch, bool training = true) const;
  /// The last stage's loss and its gradient.
  double loss_s(int64_t batch) const;
  double backward_s(int64_t batch, bool need_input_gradient) const;
  /// The part of backward_s that zero-bubble schedules defer (W): the weight gradients of the
  /// blocks whose backward splits (linear, conv2d, lm_head); the rest is B.
  double deferred_weights_s(int64_t batch) const;
  double step_s() const;
  /// A copy of the stage's weights, kept for the keys that still need this version.
  double stash_s() const;
  /// A predicted copy of the weights (staleness_correction = "predict"): measured, or two
  /// stashes (the copy, then a pass over it and the momentum buffer).
  double predict_s() const;
  /// Bytes of the stage's weights, gradients and optimizer state.
  double state_bytes() const { return state_bytes_; }
  /// The stage's trainable parameters (floats).
  int64_t parameters() const { return parameters_; }
  /// One copy of the stage's gradients or weights to host memory or back: measured per float
  /// (a profile's parameter_copy_s_per_float) or at the device's memory bandwidth.
  double parameter_copy_s() const;
  void use_measured_parameter_copy(double seconds_per_float) {
    parameter_copy_s_per_float_ = seconds_per_float;
  }
  /// Bytes a key's forward context keeps until its backward (activations per sample).
  double context_bytes_per_sample() const { return context_bytes_per_sample_; }
  const device_model& device() const { return device_; }

 private:
  double seconds(const kernel_work& work, int64_t batch) const;
  /// A measured time of a key of `measured_batch_` samples, for `batch` samples.
  double measured(double seconds, int64_t batch) const;

  std::vector<block_work> blocks_;
  std::vector<block_profile> measured_;  ///< empty: the roofline model
  int64_t measured_batch_ = 1;
  int64_t evaluation_batch_ = 0;
  double measured_loss_s_ = 0;
  kernel_work loss_;
  device_model device_;
  double state_bytes_ = 0;
  int64_t parameters_ = 0;
  double parameter_copy_s_per_float_ = 0;
  double context_bytes_per_sample_ = 0;
};

/// The work of every block of `config`'s model (per-sample shapes from model.input_shape),
/// with the job's optimizer; nothing, with `error` set, when the shapes do not chain.
std::optional<std::vector<block_work>> model_work(const actors::job_config& config,
                                                  std::string* error);

/// The work of the blocks of a model graph's node on rows of `blocks_input` features (its
/// graph_node_widths::blocks_input); nothing, with `error` set, when the shapes do not chain.
std::optional<std::vector<block_work>> node_work(const actors::graph_node_spec& node,
                                                 int64_t blocks_input,
                                                 const actors::job_config& config,
                                                 std::string* error);

/// The work of the loss over `classes` logits.
kernel_work loss_work(int64_t classes);

}  // namespace troupe::sim
