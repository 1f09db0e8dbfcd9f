#pragma once

// Factories for each kind of layer; make_layer() in layer.h is the public entry point.

#include <cstdint>
#include <memory>
#include <vector>

#include "layers/layer.h"

namespace troupe::layers {

std::unique_ptr<layer> make_linear_layer(backend& device, stream s, const layer_spec& spec,
                                         const shape& input, const shape& output, uint64_t seed);
/// One part of a linear layer that a partition cuts (spec.type linear_head or linear_tail).
std::unique_ptr<layer> make_split_linear_layer(backend& device, stream s, const layer_spec& spec,
                                               const shape& input, const shape& output,
                                               uint64_t seed);
/// One part of a convolution that a partition cuts (spec.type conv2d_head or conv2d_tail).
std::unique_ptr<layer> make_split_convolution_layer(backend& device, stream s,
                                                    const layer_spec& spec, const shape& input,
                                                    const shape& output, uint64_t seed);
std::unique_ptr<layer> make_convolution_layer(backend& device, stream s, const layer_spec& spec,
                                              const shape& input, const shape& output,
                                              uint64_t seed);
std::unique_ptr<layer> make_pooling_layer(const layer_spec& spec, const shape& input,
                                          const shape& output);
std::unique_ptr<layer> make_flatten_layer(const shape& input, const shape& output);
std::unique_ptr<layer> make_dropout_layer(const layer_spec& spec, const shape& input,
                                          uint64_t layer_index);
std::unique_ptr<layer> make_activation_layer(activation f, const shape& input);

std::unique_ptr<layer> make_embedding_layer(backend& device, stream s, const layer_spec& spec,
                                            const shape& input, const shape& output, uint64_t seed);
std::unique_ptr<layer> make_layer_norm_layer(backend& device, stream s, const shape& input);
/// `layer_index` names the block's dropout streams.
std::unique_ptr<layer> make_transformer_block(backend& device, stream s, const layer_spec& spec,
                                              const shape& input, uint64_t seed,
                                              uint64_t layer_index);

/// An LSTM cell over rows (spec.type lstm_cell, or tree_lstm_cell with spec.arity children).
std::unique_ptr<layer> make_lstm_cell_layer(backend& device, stream s, const layer_spec& spec,
                                            const shape& input, const shape& output, uint64_t seed);

/// A parameter of `dims` filled from U(-bound, bound) drawn from `generator` on the host.
parameter make_uniform_parameter(backend& device, stream s, const char* name, shape dims,
                                 float bound, class random_generator& generator);

/// A parameter named `name` holding `values` (element_count(dims) of them), its gradient
/// allocated.
parameter parameter_from_host(backend& device, stream s, const char* name, shape dims,
                              const std::vector<float>& values);

/// The initial values of a linear layer or convolution with `fan_in` inputs per output:
/// PyTorch's U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the weight [out, fan_in] and then the bias
/// [out], drawn from `seed`. Of them, rows [first, first + rows): the whole layer's with first
/// 0 and rows = out, a part's of a cut layer otherwise. `bias` stays empty without one.
struct initial_values {
  std::vector<float> weight;
  std::vector<float> bias;
};
initial_values initial_weight_rows(uint64_t seed, int64_t fan_in, int64_t out, bool bias,
                                   int64_t first, int64_t rows);

/// Adds a linear layer's weight gradients over `rows` rows: weight += dy^T x, with dy of the
/// weight's outputs and x of its inputs read `input_stride` floats apart (a cut layer's tail
/// reads x out of a wider input); bias, when it has values, += the sum of dy's rows.
void add_linear_weight_gradients(stream s, const float* output_gradient, const float* input,
                                 int input_stride, int rows, parameter& weight, parameter& bias);

/// The output rows of a part of a cut layer (split_linear_layer.cpp,
/// split_convolution_layer.cpp) from its own values `own` (`own_width` floats a row): the
/// head's [x | own] from its input x, the tail's [the head's values | own] from its input
/// [x | the head's values]. Each input row is `input_width` floats, of which `x_width` are x.
void stack_cut_output(backend& device, stream s, bool head, const float* input, int input_width,
                      int x_width, const float* own, int own_width, float* output, int rows);

}  // namespace troupe::layers
