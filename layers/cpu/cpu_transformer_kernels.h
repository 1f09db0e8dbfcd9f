#pragma once

// The CPU loops behind the backend's transformer operations (see backend.h for each contract).
// Each works on a range of rows so that the backend can split a call over its thread pool;
// every row is computed in a fixed order, so results do not depend on the split.

#include <cstdint>

namespace troupe::layers::cpu {

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* normalized, float* rstd, int first_row, int last_row, int cols,
                        float epsilon);
void layer_norm_backward(const float* dy, const float* gamma, const float* normalized,
                         const float* rstd, float* dx, int first_row, int last_row, int cols);
/// Rows [first_row, last_row) of the stacked batch of t×t matrices (row r is row r % t of
/// matrix r / t).
void causal_softmax_forward(const float* scores, float* probabilities, int first_row, int last_row,
                            int t, float scale);
void softmax_backward(const float* probabilities, const float* dp, float* dscores, int first_row,
                      int last_row, int cols, float scale);
void embedding_forward(const float* ids, const float* table, float* out, int first, int last,
                       int dim, int vocab);
/// Columns [first_column, last_column) of the table gradient.
void embedding_backward(const float* ids, const float* dout, float* table_gradient, int count,
                        int dim, int vocab, float beta, int first_column, int last_column);

}  // namespace troupe::layers::cpu
