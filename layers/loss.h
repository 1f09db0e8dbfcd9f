#pragma once

// Softmax cross-entropy, the loss at the end of every model.

#include <cstdint>
#include <vector>

#include "layers/tensor.h"

namespace troupe::layers {

/// Loss and accuracy statistics of one batch, still on the device until read.
struct loss_output {
  tensor gradient;    ///< d(loss)/d(logits), scaled; empty when not asked for
  tensor statistics;  ///< [2]: sum of per-sample losses, number of correct predictions
};

/// Softmax cross-entropy of logits [N, ..., classes] against one label per row of classes
/// (labels.size() rows: N for a classifier, N·T for a language model's [N, T, vocab]). A row
/// labelled ignored_label (a padded position) adds no loss, no gradient and no correct count;
/// a caller that means the mean over the scored rows divides by counted_labels().
/// The gradient is multiplied by gradient_scale per sample: 1/B for a batch of B samples, also
/// when the batch is split into micro-batches, so their accumulated gradients equal the whole
/// batch's. A sample of T rows spreads it over them (each row's gradient is scaled by
/// gradient_scale / T), so the loss differentiated is the mean over a sample's tokens.
loss_output softmax_cross_entropy(stream s, const tensor& logits, const int_tensor& labels,
                                  float gradient_scale, bool want_gradient);

/// The labels that the loss scores: those that are not ignored_label.
int64_t counted_labels(const std::vector<int32_t>& labels);

/// Labels one sample needs for logits of per-sample shape `logits`: one per row of classes.
inline int64_t labels_per_sample(const shape& logits) {
  return logits.empty() || logits.back() == 0 ? 1 : element_count(logits) / logits.back();
}

/// The two statistics on the host: {loss sum, correct count}; synchronizes `s`.
struct loss_totals {
  double loss_sum = 0;
  int64_t correct = 0;
};
loss_totals read_totals(stream s, const loss_output& output);

}  // namespace troupe::layers
