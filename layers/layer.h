#pragma once

// Layers: forward() returns a per-instance context that backward() consumes, so a stage can
// hold one context per key in flight. Weight gradients accumulate into the parameters until
// an optimizer steps (which clears them).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layers/layer_spec.h"
#include "layers/tensor.h"

namespace troupe::layers {

enum class pass_mode { training, evaluation };

/// How one forward or backward call runs.
struct run_options {
  stream work_stream;
  pass_mode mode = pass_mode::training;
  /// Names this step's dropout stream; the same for every micro-batch of one optimizer step.
  uint64_t seed = 0;
  /// Index of the batch's first sample within the step, so micro-batches draw the masks that
  /// the whole batch would.
  uint64_t sample_offset = 0;
  /// Composite blocks keep only their input after the forward pass and recompute the rest in
  /// the backward pass (GPipe's rematerialization): less memory, one more forward.
  bool recompute = false;
  /// Token offsets of the sequences packed into the input (a model graph's instances, without
  /// padding): sequence i is tokens [segments[i], segments[i + 1]) of the input's N·T tokens
  /// ([N, T, ...] read in order), and the last offset is N·T. Blocks over token sequences read
  /// them: transformer_block attends within each sequence only (causally), an embedding with
  /// explicit positions counts them from 0 in each; both keep the forward pass's segments for
  /// their backward pass. Null: every sample is one sequence of T tokens.
  std::shared_ptr<const std::vector<int64_t>> segments = nullptr;
};

/// What forward() saved for backward(); one per instance in flight.
class layer_context {
 public:
  virtual ~layer_context() = default;
};

/// A trainable tensor and the gradient accumulated since the last optimizer step.
struct parameter {
  std::string name;
  tensor value;
  tensor gradient;
  /// False until the first backward since the last step; accumulation then overwrites
  /// (beta = 0) instead of adding, which saves clearing the gradient after every step.
  bool has_gradient = false;

  float accumulate_beta() const { return has_gradient ? 1.0f : 0.0f; }
};

struct forward_result {
  tensor output;
  std::unique_ptr<layer_context> context;
};

class layer {
 public:
  layer(shape input_shape, shape output_shape)
      : input_shape_(std::move(input_shape)), output_shape_(std::move(output_shape)) {}
  virtual ~layer() = default;

  virtual const char* type() const = 0;
  /// Shape of one sample going in and coming out (without the batch dimension).
  const shape& input_shape() const { return input_shape_; }
  const shape& output_shape() const { return output_shape_; }

  /// Runs the layer on a batch [N, input_shape...]; the context is what backward() needs.
  virtual forward_result forward(const run_options& options, const tensor& input) = 0;
  /// Adds this instance's weight gradients to the parameters and returns the gradient with
  /// respect to the input (empty when !need_input_gradient). May overwrite output_gradient.
  virtual tensor backward(const run_options& options, layer_context& context,
                          const tensor& output_gradient, bool need_input_gradient) = 0;
  /// The first half of backward() (B, on a pipeline's critical path): returns the input
  /// gradient and keeps in `context` what backward_weights() needs for the weight gradients.
  /// Layers whose backward does not split run all of it here.
  virtual tensor backward_input(const run_options& options, layer_context& context,
                                const tensor& output_gradient, bool need_input_gradient) {
    return backward(options, context, output_gradient, need_input_gradient);
  }
  /// The second half (W): adds the weight gradients of the instance whose backward_input()
  /// ran on `context`. Zero-bubble schedules run it later, to fill the pipeline's idle time;
  /// the gradients it adds are the very ones backward() would.
  virtual void backward_weights(const run_options& options, layer_context& context) {
    (void)options, (void)context;
  }
  /// Whether backward_input() leaves work for backward_weights() (layers with weights that
  /// split their backward); the context of one that does not is done after backward_input().
  virtual bool splits_backward() const { return false; }
  virtual std::vector<parameter*> parameters() { return {}; }
  /// Floating-point operations of one forward pass over `batch` samples (GEMMs only).
  virtual double forward_flops(int64_t batch) const { return 0.0 * batch; }

 protected:
  /// [batch, sample...].
  static shape batched(int64_t batch, const shape& sample);

 private:
  shape input_shape_;
  shape output_shape_;
};

/// Per-sample output shape of `spec` applied to `input`, or nothing with `error` set (one
/// line, without the block's name: the caller prefixes it).
bool infer_output_shape(const layer_spec& spec, const shape& input, shape* output,
                        std::string* error);

/// Number of trainable values the block `spec` holds when fed per-sample `input` (whose shape
/// must chain).
int64_t parameter_count(const layer_spec& spec, const shape& input);

/// Builds the layer for `spec` (whose shapes must chain: see infer_output_shape). Weights are
/// drawn from `seed` alone, so a stage that builds only some layers gets the same weights as
/// a run that builds them all. `layer_index` names the layer's dropout stream.
std::unique_ptr<layer> make_layer(backend& device, stream s, const layer_spec& spec,
                                  const shape& input, uint64_t seed, uint64_t layer_index);

}  // namespace troupe::layers
