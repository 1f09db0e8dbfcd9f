#pragma once

// Softmax cross-entropy, the loss at the end of every model.

#include <cstdint>

#include "layers/tensor.h"

namespace troupe::layers {

/// Loss and accuracy statistics of one batch, still on the device until read.
struct loss_output {
  tensor gradient;    ///< d(loss)/d(logits), scaled; empty when not asked for
  tensor statistics;  ///< [2]: sum of per-sample losses, number of correct predictions
};

/// Softmax cross-entropy of logits [N, classes] against labels (N of them, on the device).
/// The gradient is multiplied by gradient_scale: 1/B for a batch of B samples, also when the
/// batch is split into micro-batches, so their accumulated gradients equal the whole batch's.
loss_output softmax_cross_entropy(stream s, const tensor& logits, const int_tensor& labels,
                                  float gradient_scale, bool want_gradient);

/// The two statistics on the host: {loss sum, correct count}; synchronizes `s`.
struct loss_totals {
  double loss_sum = 0;
  int64_t correct = 0;
};
loss_totals read_totals(stream s, const loss_output& output);

}  // namespace troupe::layers
