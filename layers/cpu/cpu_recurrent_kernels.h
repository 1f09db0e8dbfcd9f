#pragma once

// The CPU loops behind the backend's recurrent-cell operations (see backend.h for each
// contract). Each works on a range of rows so that the backend can split a call over its
// thread pool; a row's values do not depend on the split.

#include "layers/backend.h"

namespace troupe::layers::cpu {

void lstm_cell_forward(const lstm_cell_geometry& g, float* gates, const float* input, float* output,
                       int first_row, int last_row);
void lstm_cell_backward(const lstm_cell_geometry& g, const float* gates, const float* input,
                        const float* output, const float* output_gradient, float* gate_gradient,
                        float* input_gradient, int first_row, int last_row);

}  // namespace troupe::layers::cpu
