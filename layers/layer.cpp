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
  if (t == "linear") {
    if (input.size() != 1) {
      return fail(error, "needs a flat input [features], got " + to_string(input) +
                             " (add { type = \"flatten\" } before it)");
    }
    if (spec.out < 1) return fail(error, "out must be at least 1");
    *output = {spec.out};
    return true;
  }
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
  if (spec.type == "linear") return element_count(input) * spec.out + bias;
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
  if (t == "linear") return make_linear_layer(device, s, spec, input, output, seed);
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
