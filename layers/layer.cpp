#include "layers/layer.h"

#include <algorithm>

#include "layers/check.h"
#include "layers/layer_kinds.h"
#include "layers/layer_registry.h"

namespace troupe::layers {

shape layer::batched(int64_t batch, const shape& sample) {
  shape dims{batch};
  dims.insert(dims.end(), sample.begin(), sample.end());
  return dims;
}

namespace {

bool fail(std::string* error, std::string message) {
  *error = std::move(message);
  return false;
}

bool image_output(const layer_spec& spec, const shape& input, int64_t channels, int kernel,
                  int stride, int padding, shape* output, std::string* error) {
  if (input.size() != 3) {
    return fail(error, "needs an input of shape [channels, height, width], got " +
                           to_string(input) + " (is a flatten misplaced?)");
  }
  const int64_t height = (input[1] + 2 * padding - kernel) / stride + 1;
  const int64_t width = (input[2] + 2 * padding - kernel) / stride + 1;
  if (input[1] + 2 * padding < kernel || input[2] + 2 * padding < kernel) {
    return fail(error, "kernel " + std::to_string(kernel) + " is larger than its input " +
                           to_string(input) + " (with padding " + std::to_string(padding) + ")");
  }
  (void)spec;
  *output = {channels, height, width};
  return true;
}

/// [h | c] from a row [x | h_1 | c_1 | ... | h_N | c_N] (N = 1 for lstm_cell).
bool lstm_cell_output(const layer_spec& spec, const shape& input, shape* output,
                      std::string* error) {
  const bool tree = spec.type == "tree_lstm_cell";
  if (spec.out < 1) return fail(error, "out (the hidden size) must be at least 1");
  if (tree && spec.arity < 1) return fail(error, "arity must be at least 1");
  const int64_t children = tree ? spec.arity : 1;
  const int64_t states = 2 * children * spec.out;
  if (input.size() == 1 && input[0] > states) {
    *output = {2 * int64_t(spec.out)};
    return true;
  }
  const std::string n = std::to_string(children);
  const std::string row =
      tree ? "[x | h_1 | c_1 | ... | h_" + n + " | c_" + n + "]" : "[x | h | c]";
  const std::string sizes = tree ? "2 x arity " + n + " x out " : "2 x out ";
  return fail(error, "needs input rows " + row + " of more than " + std::to_string(states) +
                         " features (" + sizes + std::to_string(spec.out) +
                         " for the states, then at least one of x), got " + to_string(input));
}

}  // namespace

bool infer_output_shape(const layer_spec& spec, const shape& input, shape* output,
                        std::string* error) {
  const std::string& t = spec.type;
  if (t == "relu" || t == "tanh" || t == "gelu" || t == "dropout") {
    *output = input;
    return true;
  }
  if (t == "flatten") {
    *output = {element_count(input)};
    return true;
  }
  if (t == "linear" || t == "lm_head") {
    if (input.size() != 1 && input.size() != 2) {
      return fail(error, "needs an input [features] or [tokens, features], got " +
                             to_string(input) + " (add { type = \"flatten\" } before it)");
    }
    const int out = t == "linear" ? spec.out : spec.vocab;
    if (out < 1)
      return fail(error, std::string(t == "linear" ? "out" : "vocab") + " must be at least 1");
    *output = input;
    output->back() = out;
    return true;
  }
  if (t == "linear_head" || t == "linear_tail") {
    const int64_t inputs = input.empty() ? 0 : input.back() - (t == "linear_tail" ? spec.split : 0);
    if ((input.size() != 1 && input.size() != 2) || inputs < 1) {
      return fail(error,
                  "needs an input [features] or [tokens, features], got " + to_string(input));
    }
    if (spec.split < 1 || spec.split >= spec.out) {
      return fail(error, "split " + std::to_string(spec.split) + " must be in [1, " +
                             std::to_string(spec.out - 1) + "] (out = " + std::to_string(spec.out) +
                             ")");
    }
    *output = input;
    output->back() = t == "linear_head" ? inputs + spec.split : spec.out;
    return true;
  }
  if (t == "conv2d_head" || t == "conv2d_tail") {
    const int64_t channels = input.empty() ? 0 : input[0] - (t == "conv2d_tail" ? spec.split : 0);
    if (input.size() != 3 || channels < 1) {
      return fail(error,
                  "needs an input of shape [channels, height, width], got " + to_string(input));
    }
    if (spec.split < 1 || spec.split >= spec.out || spec.kernel < 1) {
      return fail(error, "split " + std::to_string(spec.split) + " must be in [1, " +
                             std::to_string(spec.out - 1) + "] (out = " + std::to_string(spec.out) +
                             ")");
    }
    *output = {t == "conv2d_head" ? channels + spec.split : spec.out, input[1], input[2]};
    return true;
  }
  if (t == "embedding") {
    if (input.size() != 1) {
      return fail(error, "needs an input of token ids [context], got " + to_string(input) +
                             " (is model.input_shape [data.context]?)");
    }
    if (spec.vocab < 1 || spec.dim < 1) return fail(error, "vocab and dim must be at least 1");
    if (spec.positions > 0 && input[0] > spec.positions) {
      return fail(error, "the context is " + std::to_string(input[0]) +
                             " tokens but positions is " + std::to_string(spec.positions) +
                             " (raise positions or lower data.context)");
    }
    *output = {input[0], spec.dim};
    return true;
  }
  if (t == "layernorm" || t == "transformer_block") {
    if (input.size() != 2) {
      return fail(error, "needs an input [tokens, width], got " + to_string(input) +
                             " (put an embedding before it)");
    }
    if (t == "transformer_block") {
      if (spec.heads < 1) return fail(error, "heads must be at least 1");
      if (input[1] % spec.heads != 0) {
        return fail(error, "heads (" + std::to_string(spec.heads) + ") must divide the width " +
                               std::to_string(input[1]));
      }
      if (spec.mlp_ratio < 1) return fail(error, "mlp_ratio must be at least 1");
    }
    *output = input;
    return true;
  }
  if (t == "lstm_cell" || t == "tree_lstm_cell")
    return lstm_cell_output(spec, input, output, error);
  if (t == "conv2d") {
    if (spec.out < 1 || spec.kernel < 1) return fail(error, "out and kernel must be at least 1");
    return image_output(spec, input, spec.out, spec.kernel, std::max(spec.stride, 1), spec.padding,
                        output, error);
  }
  if (t == "maxpool2d") {
    const int kernel = spec.kernel > 0 ? spec.kernel : 2;
    const int stride = spec.stride > 0 ? spec.stride : kernel;
    return image_output(spec, input, input.empty() ? 0 : input[0], kernel, stride, 0, output,
                        error);
  }
  if (const custom_layer_type* custom = find_custom_layer_type(t))
    return custom->output_shape(spec, input, output, error);
  return fail(error, "unknown layer type '" + t + "'");
}

int64_t parameter_count(const layer_spec& spec, const shape& input) {
  const int64_t bias = spec.bias ? spec.out : 0;
  const int64_t width = input.empty() ? 0 : input.back();
  if (spec.type == "linear") return width * spec.out + bias;
  if (spec.type == "linear_head") return width * spec.split + (spec.bias ? spec.split : 0);
  if (spec.type == "linear_tail") {
    const int64_t rows = spec.out - spec.split;
    return (width - spec.split) * rows + (spec.bias ? rows : 0);
  }
  if (spec.type == "conv2d_head" || spec.type == "conv2d_tail") {
    const bool head = spec.type == "conv2d_head";
    const int64_t rows = head ? spec.split : spec.out - spec.split;
    const int64_t channels = (input.empty() ? 0 : input[0]) - (head ? 0 : spec.split);
    return channels * spec.kernel * spec.kernel * rows + (spec.bias ? rows : 0);
  }
  if (spec.type == "lm_head") return width * spec.vocab + (spec.bias ? spec.vocab : 0);
  if (spec.type == "embedding") {
    const int64_t positions = spec.positions > 0 ? spec.positions : (input.empty() ? 0 : input[0]);
    return (int64_t(spec.vocab) + positions) * spec.dim;
  }
  if (spec.type == "layernorm") return 2 * width;
  if (spec.type == "transformer_block") {
    const int64_t wide = width * spec.mlp_ratio;
    return 4 * width + (3 * width * width + 3 * width) + (width * width + width) +
           (width * wide + wide) + (wide * width + width);
  }
  if (spec.type == "lstm_cell" || spec.type == "tree_lstm_cell") {
    const int64_t children = spec.type == "lstm_cell" ? 1 : spec.arity;
    const int64_t gates = (3 + children) * spec.out;
    return gates * (width - children * spec.out) + (spec.bias ? gates : 0);
  }
  if (spec.type == "conv2d") {
    return (input.empty() ? 0 : input[0]) * spec.kernel * spec.kernel * spec.out + bias;
  }
  const custom_layer_type* custom = find_custom_layer_type(spec.type);
  if (custom && custom->parameter_count) return custom->parameter_count(spec, input);
  return 0;
}

std::unique_ptr<layer> make_layer(backend& device, stream s, const layer_spec& spec,
                                  const shape& input, uint64_t seed, uint64_t layer_index) {
  shape output;
  std::string error;
  TROUPE_CHECK(infer_output_shape(spec, input, &output, &error));
  const std::string& t = spec.type;
  if (t == "linear" || t == "lm_head")
    return make_linear_layer(device, s, spec, input, output, seed);
  if (t == "linear_head" || t == "linear_tail")
    return make_split_linear_layer(device, s, spec, input, output, seed);
  if (t == "conv2d_head" || t == "conv2d_tail")
    return make_split_convolution_layer(device, s, spec, input, output, seed);
  if (t == "embedding") return make_embedding_layer(device, s, spec, input, output, seed);
  if (t == "layernorm") return make_layer_norm_layer(device, s, input);
  if (t == "transformer_block")
    return make_transformer_block(device, s, spec, input, seed, layer_index);
  if (t == "lstm_cell" || t == "tree_lstm_cell")
    return make_lstm_cell_layer(device, s, spec, input, output, seed);
  if (t == "conv2d") return make_convolution_layer(device, s, spec, input, output, seed);
  if (t == "maxpool2d") return make_pooling_layer(spec, input, output);
  if (t == "flatten") return make_flatten_layer(input, output);
  if (t == "dropout") return make_dropout_layer(spec, input, layer_index);
  if (t == "relu") return make_activation_layer(activation::relu, input);
  if (t == "tanh") return make_activation_layer(activation::tanh, input);
  if (const custom_layer_type* custom = find_custom_layer_type(t))
    return custom->make(device, s, spec, input, output, seed);
  TROUPE_CHECK(t == "gelu");
  return make_activation_layer(activation::gelu, input);
}

}  // namespace troupe::layers
