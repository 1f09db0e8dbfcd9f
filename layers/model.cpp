#include "layers/model.h"

#include "layers/check.h"
#include "layers/random.h"

namespace troupe::layers {

std::optional<std::vector<shape>> infer_shapes(const std::vector<layer_spec>& specs,
                                               const shape& input, std::string* error) {
  std::vector<shape> shapes;
  shape current = input;
  for (size_t i = 0; i < specs.size(); ++i) {
    shape next;
    std::string problem;
    if (!infer_output_shape(specs[i], current, &next, &problem)) {
      *error = "model.layers[" + std::to_string(i) + "] (" + specs[i].type + "): " + problem;
      return std::nullopt;
    }
    shapes.push_back(next);
    current = std::move(next);
  }
  return shapes;
}

sequential::sequential(backend& device, stream s, const std::vector<layer_spec>& specs,
                       const shape& input, size_t first, size_t last, uint64_t seed) {
  TROUPE_CHECK(first <= last && last <= specs.size());
  std::string error;
  auto shapes = infer_shapes(specs, input, &error);
  TROUPE_CHECK(shapes.has_value());
  input_shape_ = first == 0 ? input : (*shapes)[first - 1];
  shape current = input_shape_;
  for (size_t i = first; i < last; ++i) {
    // A cut linear layer's parts and the blocks after them draw what the uncut model's would.
    const uint64_t index = specs[i].origin >= 0 ? static_cast<uint64_t>(specs[i].origin) : i;
    layers_.push_back(make_layer(device, s, specs[i], current, derive_seed(seed, index), index));
    current = (*shapes)[i];
  }
  output_shape_ = current;
  while (first_with_parameters_ < layers_.size() &&
         layers_[first_with_parameters_]->parameters().empty()) {
    ++first_with_parameters_;
  }
  device.synchronize(s);
}

tensor sequential::forward(const run_options& options, const tensor& input,
                           sequential_context* context) {
  tensor current = input;
  if (context) context->layers.clear();
  for (auto& each : layers_) {
    forward_result result = each->forward(options, current);
    if (context) context->layers.push_back(std::move(result.context));
    current = std::move(result.output);
  }
  return current;
}

tensor sequential::backward(const run_options& options, sequential_context& context,
                            const tensor& output_gradient, bool need_input_gradient) {
  TROUPE_CHECK(context.layers.size() == layers_.size());
  tensor gradient = output_gradient;
  for (size_t i = layers_.size(); i-- > 0;) {
    const bool need = needs_input_gradient(i, need_input_gradient);
    gradient = layers_[i]->backward(options, *context.layers[i], gradient, need);
    context.layers[i].reset();
  }
  return gradient;
}

tensor sequential::backward_input(const run_options& options, sequential_context& context,
                                  const tensor& output_gradient, bool need_input_gradient) {
  TROUPE_CHECK(context.layers.size() == layers_.size());
  tensor gradient = output_gradient;
  for (size_t i = layers_.size(); i-- > 0;) {
    const bool need = needs_input_gradient(i, need_input_gradient);
    gradient = layers_[i]->backward_input(options, *context.layers[i], gradient, need);
    if (!layers_[i]->splits_backward()) context.layers[i].reset();
  }
  return gradient;
}

void sequential::backward_weights(const run_options& options, sequential_context& context) {
  TROUPE_CHECK(context.layers.size() == layers_.size());
  for (size_t i = layers_.size(); i-- > 0;) {
    if (context.layers[i]) layers_[i]->backward_weights(options, *context.layers[i]);
    context.layers[i].reset();
  }
}

std::vector<parameter*> sequential::parameters() {
  std::vector<parameter*> result;
  for (auto& each : layers_) {
    for (parameter* p : each->parameters()) result.push_back(p);
  }
  return result;
}

int64_t sequential::parameter_count() {
  int64_t count = 0;
  for (parameter* p : parameters()) count += p->value.size();
  return count;
}

double sequential::forward_flops(int64_t batch) const {
  double flops = 0;
  for (const auto& each : layers_) flops += each->forward_flops(batch);
  return flops;
}

}  // namespace troupe::layers
