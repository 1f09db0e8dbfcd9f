#pragma once

// Moving rows between row-major tensors by index lists, on any backend: what a model graph
// needs to join the states of a key's parts into one batch and to send them back (rows of
// different instances, gathered without padding).

#include <cstdint>
#include <vector>

#include "layers/tensor.h"

namespace troupe::layers {

/// A block of `width` columns starting at column `column` of a tensor's rows ([rows, ...]
/// seen as rows × row_size()).
struct column_block {
  const tensor* data;
  int64_t column = 0;
};

/// For each i: target row i, columns [target_column, target_column + width), gets source row
/// rows[i]'s columns [source_column, ...), or zeros where rows[i] is -1.
void gather_rows(stream s, const tensor& source, int64_t source_column,
                 const std::vector<int64_t>& rows, tensor& target, int64_t target_column,
                 int64_t width);

/// For each i with rows[i] ≥ 0: target row rows[i]'s columns [target_column, + width) get
/// (add: are added) source row i's columns [source_column, ...).
void scatter_rows(stream s, const tensor& source, int64_t source_column,
                  const std::vector<int64_t>& rows, tensor& target, int64_t target_column,
                  int64_t width, bool add);

}  // namespace troupe::layers
