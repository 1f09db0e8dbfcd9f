#pragma once

// What a job needs in memory, from its layer shapes alone (nothing is allocated): each block's
// weights, gradients and optimizer state, and the activations a training key keeps from its
// forward pass to its backward pass. The simulator charges a device's memory with these
// figures (sim/cost_model.h), and `troupe train` refuses a job that cannot fit on its machine
// before it allocates anything.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "layers/layer_spec.h"
#include "layers/tensor.h"

namespace troupe::actors {

/// Bytes of one value of a tensor, a weight or an optimizer moment (float32).
constexpr double value_bytes = 4;

/// What one block of a model keeps in memory.
struct block_memory {
  int64_t parameters = 0;
  /// Weights, their gradients and the optimizer's state (a velocity, or Adam's two moments).
  double state_bytes = 0;
  /// Floats per sample that a training forward pass keeps until its backward pass: the output
  /// for most blocks; a convolution's unfolded input (im2col); a transformer block's every
  /// intermediate, or only its input under parallelism.recompute.
  int64_t context_elements = 0;
};

/// The memory of block `spec` between per-sample shapes `input` and `output`, with `job`'s
/// optimizer and recompute setting.
block_memory memory_of_block(const layers::layer_spec& spec, const layers::shape& input,
                             const layers::shape& output, const job_config& job);

/// What a run of `config` needs at least on the machine that hosts all its stages.
struct memory_estimate {
  /// Every replica's weights, gradients and optimizer state.
  double state_bytes = 0;
  /// The activations one key keeps through every stage, times the replicas (each trains a key
  /// of its own at once); more keys in flight need more.
  double key_bytes = 0;
  int64_t key_samples = 0;  ///< samples per key (micro_batch_size)
  /// The data set made in memory before training (data.dataset "synthetic"; 0 otherwise:
  /// files are read at their size).
  double data_bytes = 0;
  double total_bytes() const { return state_bytes + key_bytes + data_bytes; }
};

/// The estimate of `config`; nothing, with `error` naming the block, when its shapes do not
/// chain.
std::optional<memory_estimate> estimate_memory(const job_config& config, std::string* error);

/// False, with `error` giving the estimate, `available_bytes` (the machine's memory) and the
/// keys to change, when `config` needs more than `available_bytes` (with stages on GPUs, only
/// its data counts here); also false when its shapes do not chain.
bool check_memory(const job_config& config, double available_bytes, std::string* error);

}  // namespace troupe::actors
