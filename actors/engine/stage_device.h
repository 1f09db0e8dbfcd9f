#pragma once

// The device work of one stage, behind an interface so that the stage state machine never
// touches a backend itself: the real host runs it on a CPU or GPU backend, the simulator
// charges its time (and may also run it for numerics).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/partition.h"
#include "actors/engine/pipeline_messages.h"
#include "actors/engine/stage_state.h"
#include "layers/backend.h"
#include "layers/device_group.h"
#include "layers/layer.h"

namespace troupe::actors {

struct loss_result {
  layers::tensor gradient;
  double loss_sum = 0;
  int64_t correct = 0;
};

/// Device work for one stage, called by one thread at a time (the stage's actor, on whichever
/// scheduler thread runs it). Every method returns with its device work finished: tensors it
/// returns and its parameters may then be read on any stream of the backend, or copied to the
/// host, without further synchronization. Tensors passed in (message payloads) must likewise
/// be finished, which holds for tensors returned by a stage device and for those that
/// key_from_wire() and tensor::from_host() make.
class stage_device {
 public:
  virtual ~stage_device() = default;

  /// Whether `message` fits this stage: its payload has the stage's input shape (forward,
  /// evaluate) or output shape (backward, for a key whose forward ran here, same batch), and
  /// labels, when present, one per sample. A message from a confused or hostile peer is
  /// refused here, with `error` saying why, before it reaches a kernel.
  virtual bool accepts(const key_message& message, std::string* error) const = 0;
  /// The width of the output rows that the loss reads as class scores (a last stage's
  /// classes, or a language model's vocabulary); -1 where the device cannot tell.
  virtual int64_t classes() const { return -1; }
  /// Runs the stage's layers on a key's input and keeps what backward needs (training only).
  virtual layers::tensor forward(const key_message& message, bool training) = 0;
  /// Loss of the last stage's output against the key's labels, gradient scaled by `scale`.
  virtual loss_result loss(const layers::tensor& logits, const std::vector<int32_t>& labels,
                           float scale, bool want_gradient) = 0;
  /// Backward of `key` (whose forward ran here): accumulates weight gradients and returns the
  /// gradient of the stage's input (empty on the first stage).
  virtual layers::tensor backward(const key_message& message, bool need_input_gradient) = 0;
  /// Backward's first half (B): the gradient of the stage's input, leaving the weight
  /// gradients of `key` for backward_weights() (zero-bubble schedules). A device whose layers
  /// do not split does all of backward() here.
  virtual layers::tensor backward_input(const key_message& message, bool need_input_gradient) {
    return backward(message, need_input_gradient);
  }
  /// Backward's second half (W) of a key whose backward_input() ran: accumulates its weight
  /// gradients, the same values backward() would have added.
  virtual void backward_weights(uint64_t key) { (void)key; }
  /// The squared L2 norm of the gradients accumulated since the last step.
  virtual double squared_gradient_norm() = 0;
  /// One optimizer step with the gradients accumulated since the last, multiplied by
  /// `gradient_scale` first (gradient clipping); `momentum`, where given (≥ 0), is this step's
  /// momentum (SGD) or β1 (NAdam) instead of the job's (layers::optimizer::step).
  virtual void step(float learning_rate, float gradient_scale = 1.0f, float momentum = -1.0f) = 0;
  /// Weight stashing: remember the current weights as `version` (before a step changes them).
  virtual void stash_weights(int64_t version) = 0;
  /// Weight prediction (SpecTrain): stashes as `version` the current weights moved along the
  /// optimizer's momentum buffer b, w − distance · b: where `distance` / lr steps of SGD with
  /// momentum would take them if the gradients stayed as they are.
  virtual void stash_predicted_weights(int64_t version, float distance) = 0;
  /// Weight stashing: run the next forward or backward with the weights of `version`, or the
  /// current ones.
  virtual void use_weights(int64_t version) = 0;
  /// Drops stashed weights older than `version`.
  virtual void release_weights_before(int64_t version) = 0;
  /// Number of forward contexts held (keys between their forward and backward here).
  virtual size_t held_contexts() const = 0;
  /// The most bytes the stage has held beyond its weights, gradients and optimizer state:
  /// activations kept for backward passes, messages in flight through it, temporaries.
  virtual int64_t peak_activation_bytes() const { return 0; }
  /// The stage's trainable parameters, in layer order.
  virtual std::vector<layers::parameter*> parameters() = 0;
  /// The gradients accumulated since the last step in host memory, every parameter's in
  /// order, followed by one flag per parameter (1: it received some; its values are 0 when
  /// not): what a stage all-reduces with the same stage of the other replicas. Summed flags
  /// tell set_gradient_values() which parameters any replica touched.
  /// Into `values`, whose memory is reused when it has the size already.
  virtual void read_gradient_values(std::vector<float>* values);
  /// Puts a sum of gradient_values() in place of the accumulated gradients; a parameter whose
  /// flag sums to 0 stays without a gradient (its step skips it, as it would have).
  virtual void set_gradient_values(const std::vector<float>& values);
  /// The length of gradient_values().
  virtual int64_t gradient_value_count();
  /// False for a device that computes shapes only (the simulator's timing mode): its
  /// gradient_values() and weight_values() are empty, and the replicas' all-reduce moves
  /// sizes only.
  virtual bool holds_values() const { return true; }
  /// The weights, every parameter's in order, in host memory (async replicas average them).
  /// Into `values`, whose memory is reused when it has the size already.
  virtual void read_weight_values(std::vector<float>* values);
  /// Puts `values` (as weight_values() lays them out) in place of the weights.
  virtual void set_weight_values(const std::vector<float>& values);
  /// The length of weight_values().
  virtual int64_t weight_value_count();
  /// Replicas whose stages sum on their devices (NCCL, shared memory): the accumulated
  /// gradients become their sum over `group`, where a parameter no replica touched stays
  /// without a gradient, as set_gradient_values() leaves it. Every rank calls it at the same
  /// point of its step.
  void sum_gradients_in_group(layers::device_group& group);
  /// The weights become their mean over `group` (async replicas' average).
  void average_weights_in_group(layers::device_group& group);
  /// Weights, accumulated gradients and optimizer state, copied to host memory (the version
  /// fields are the stage logic's to fill). Only meaningful with no key in flight.
  virtual stage_state save_state() = 0;
  /// Puts `state`'s tensors in place (with `weights_only`, only its parameters, keeping the
  /// fresh optimizer). False, with `error` naming the tensor, when a name or shape differs
  /// from this stage's; nothing changes then. Drops forward contexts and stashed weights.
  virtual bool load_state(const stage_state& state, bool weights_only, std::string* error) = 0;
};

/// The device work of blocks `range` of `config`'s model on `device`, with the job's optimizer
/// (of nodes `range` where the model is a graph: actors/engine/graph_stage_device.h).
std::unique_ptr<stage_device> make_layers_stage_device(const job_config& config, stage_range range,
                                                       layers::backend& device);

}  // namespace troupe::actors
