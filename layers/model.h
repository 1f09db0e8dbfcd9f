#pragma once

// A contiguous run of layers (a whole model, or one stage's partition of it).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/layer.h"

namespace troupe::layers {

/// Per-sample output shape after every block of `specs` applied to `input`, or nothing with
/// `error` naming the first block that does not chain, as "model.layers[3] (linear): ...".
std::optional<std::vector<shape>> infer_shapes(const std::vector<layer_spec>& specs,
                                               const shape& input, std::string* error);

/// The contexts of one instance's forward pass through a sequential, one per layer.
struct sequential_context {
  std::vector<std::unique_ptr<layer_context>> layers;
};

class sequential {
 public:
  /// Builds blocks [first, last) of `specs` (whose shapes must chain from `input`, the
  /// per-sample shape fed to the whole model). Layer i's weights come from
  /// derive_seed(seed, i), so any partition of a model holds the weights the whole would.
  sequential(backend& device, stream s, const std::vector<layer_spec>& specs, const shape& input,
             size_t first, size_t last, uint64_t seed);

  /// Runs the layers on a batch. With a context (training) it records what backward needs.
  tensor forward(const run_options& options, const tensor& input, sequential_context* context);
  /// Accumulates weight gradients; returns the input gradient when need_input_gradient.
  tensor backward(const run_options& options, sequential_context& context,
                  const tensor& output_gradient, bool need_input_gradient);

  /// Backward's first half (B): the input gradient, every layer's weight-gradient work left
  /// in `context` for backward_weights() (layers that do not split do theirs now).
  tensor backward_input(const run_options& options, sequential_context& context,
                        const tensor& output_gradient, bool need_input_gradient);
  /// Backward's second half (W) on a context backward_input() ran on; frees the context.
  void backward_weights(const run_options& options, sequential_context& context);

  std::vector<parameter*> parameters();
  int64_t parameter_count();
  size_t size() const { return layers_.size(); }
  layer& at(size_t index) { return *layers_[index]; }
  const shape& input_shape() const { return input_shape_; }
  const shape& output_shape() const { return output_shape_; }
  /// GEMM floating-point operations of one forward pass over `batch` samples.
  double forward_flops(int64_t batch) const;

 private:
  /// Whether layer `index` must compute its input gradient: when the caller wants the whole
  /// run's (`need_input_gradient`), or when a layer before it has parameters. A leading
  /// flatten or activation makes the first parameterized layer's input gradient unneeded.
  bool needs_input_gradient(size_t index, bool need_input_gradient) const {
    return need_input_gradient || index > first_with_parameters_;
  }

  std::vector<std::unique_ptr<layer>> layers_;
  /// Index of the first layer with parameters (size() when none has any).
  size_t first_with_parameters_ = 0;
  shape input_shape_;
  shape output_shape_;
};

}  // namespace troupe::layers
