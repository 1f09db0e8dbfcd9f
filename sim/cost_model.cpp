#include "sim/cost_model.h"

#include <algorithm>

#include "actors/engine/memory_estimate.h"
#include "layers/model.h"

namespace troupe::sim {
namespace {

constexpr double float_bytes = actors::value_bytes;

/// Bytes per parameter an optimizer step reads and writes: weight, gradient and velocity
/// (SGD with momentum) or both moments (Adam).
double step_bytes_per_parameter(const actors::training_config& training) {
  if (training.optimizer != layers::optimizer_kind::sgd) return 7 * float_bytes;
  return (training.momentum != 0 ? 5 : 3) * float_bytes;
}

/// Floating-point operations per element of an elementwise block's forward pass.
double elementwise_flops(const std::string& type) {
  if (type == "gelu") return 20;
  if (type == "tanh") return 10;
  return 1;
}

/// The optimizer's step and a stash of a block's parameters (work->parameters), in `tensors`
/// tensors.
void charge_parameters(block_work* work, int tensors, const actors::training_config& training) {
  const double parameters = static_cast<double>(work->parameters);
  work->step = {0, 0, step_bytes_per_parameter(training) * parameters, tensors};
  work->stash = {0, 0, 2 * float_bytes * parameters, tensors};
}

/// A GPT block over T tokens of width D (H heads, MLP ratio r): four GEMMs of weights (2·T·D²·
/// (4 + 2r) FLOPs), attention's two batched GEMMs (4·T²·D) and its H·T×T probabilities, two
/// layer norms, GELU and two residual adds. The backward pass does twice the GEMM work (the
/// weight gradients in backward_weights, the rest in backward_input) and, under recompute,
/// the forward pass again first.
void transformer_work(const layers::layer_spec& spec, const layers::shape& input, bool recompute,
                      const actors::training_config& training, block_work* work) {
  const double t = static_cast<double>(input[0]), d = static_cast<double>(input[1]);
  const double r = spec.mlp_ratio, h = spec.heads;
  const double token_weights = d * d * (4 + 2 * r);
  const double gemm = 2 * t * token_weights;
  const double attention = 4 * t * t * d;
  const double scores = h * t * t;
  const double activations = t * d * (10 + 2 * r);  // floats written and read per sample
  const double parameter_bytes = float_bytes * static_cast<double>(work->parameters);
  const double elementwise = 20 * t * d + 20 * t * r * d + 5 * scores;
  work->forward = {gemm + attention + elementwise, float_bytes * (activations + 2 * scores),
                   parameter_bytes, 14};
  work->backward_weights = {gemm, float_bytes * activations, 2 * parameter_bytes, 8};
  work->backward_input = {gemm + 2 * attention + 2 * elementwise,
                          float_bytes * (activations + 4 * scores), parameter_bytes, 16};
  if (recompute) {
    work->backward_input.flops_per_sample += work->forward.flops_per_sample;
    work->backward_input.bytes_per_sample += work->forward.bytes_per_sample;
    work->backward_input.fixed_bytes += work->forward.fixed_bytes;
    work->backward_input.kernels += work->forward.kernels;
  }
  charge_parameters(work, 12, training);
}

block_work work_of(const layers::layer_spec& spec, const layers::shape& input,
                   const layers::shape& output, const actors::job_config& job) {
  const actors::training_config& training = job.training;
  block_work work;
  work.type = spec.type;
  const double in = static_cast<double>(layers::element_count(input));
  const double out = static_cast<double>(layers::element_count(output));
  work.output_elements = layers::element_count(output);
  const actors::block_memory memory = actors::memory_of_block(spec, input, output, job);
  work.parameters = memory.parameters;
  work.state_bytes = memory.state_bytes;
  work.context_elements = memory.context_elements;
  if (spec.type == "transformer_block") {
    transformer_work(spec, input, job.parallelism.recompute, training, &work);
    return work;
  }
  if (spec.type == "embedding") {
    // A gather of T rows and the positions added; the backward pass scatters them back.
    charge_parameters(&work, 2, training);
    work.forward = {out, float_bytes * (in + 3 * out), 0, 2};
    work.backward_weights = {2 * out, float_bytes * 3 * out, 0, 2};
    return work;
  }
  if (spec.type == "layernorm") {
    charge_parameters(&work, 2, training);
    work.forward = {8 * out, float_bytes * 3 * out, 0, 1};
    work.backward_weights = {3 * out, float_bytes * 3 * out, 0, 3};
    work.backward_input = {10 * out, float_bytes * 4 * out, 0, 1};
    return work;
  }
  if (layers::is_cut_part(spec.type)) {
    // One part of a cut linear layer or convolution: a GEMM over its rows of the weights (a
    // convolution's over unfolded patches), and copies of what it passes on
    // (layers/split_linear_layer.cpp, split_convolution_layer.cpp).
    const bool head = layers::is_cut_head(spec.type);
    const bool convolution = spec.type == "conv2d_head" || spec.type == "conv2d_tail";
    const double channels =
        static_cast<double>(convolution ? input[0] : input.back()) - (head ? 0 : spec.split);
    const double fan_in = convolution ? channels * spec.kernel * spec.kernel : channels;
    const double rows = head ? spec.split : spec.out - spec.split;
    // Pixels of a convolution's image (it keeps its size), tokens of a linear layer's sample.
    const double positions =
        convolution ? static_cast<double>(input[1] * input[2]) : in / input.back();
    const double unfolded = convolution ? fan_in * positions : 0;
    const double weights = fan_in * rows;
    const double parameter_bytes = float_bytes * work.parameters;
    const double gemm_flops = 2 * weights * positions;
    const double own = rows * positions;  // this part's outputs per sample
    const int extra = (spec.bias ? 1 : 0) + (convolution ? 3 : 0);
    work.forward = {gemm_flops,
                    float_bytes * (in + 3 * own + 2 * (out - own) + unfolded + (head ? 0 : in)),
                    parameter_bytes, 3 + extra};
    work.backward_weights = {gemm_flops, float_bytes * (own + fan_in * positions + unfolded),
                             2 * parameter_bytes, 1 + extra};
    work.backward_input = {gemm_flops, float_bytes * (3 * out + 2 * in + unfolded), parameter_bytes,
                           4 + (convolution ? 2 : 0)};
    charge_parameters(&work, spec.bias ? 2 : 1, training);
  } else if (spec.type == "linear" || spec.type == "conv2d" || spec.type == "lm_head") {
    // A convolution is a GEMM over unfolded patches: (channels × k × k) inputs per output.
    // A linear layer over [T, D] tokens is a GEMM of T rows of D features.
    const bool convolution = spec.type == "conv2d";
    const int outputs = spec.type == "lm_head" ? spec.vocab : spec.out;
    const double fan_in =
        convolution ? input[0] * double(spec.kernel) * spec.kernel : double(input.back());
    const double positions = convolution ? out / spec.out : in / fan_in;  // pixels or tokens
    const double weights = fan_in * outputs;
    const double parameter_bytes = float_bytes * work.parameters;
    const double unfolded = convolution ? fan_in * positions : 0;  // im2col columns
    const double gemm_flops = 2 * weights * positions;
    const int extra = (spec.bias ? 1 : 0) + (convolution ? 2 : 0);
    work.forward = {gemm_flops, float_bytes * (in + out + unfolded), parameter_bytes, 1 + extra};
    work.backward_weights = {gemm_flops, float_bytes * (out + in + unfolded), 2 * parameter_bytes,
                             1 + (spec.bias ? 1 : 0) + (convolution ? 1 : 0)};
    work.backward_input = {gemm_flops, float_bytes * (out + in + unfolded), parameter_bytes,
                           1 + (convolution ? 1 : 0)};
    charge_parameters(&work, spec.bias ? 2 : 1, training);
  } else if (work.parameters > 0) {
    // A registered type with weights: charged as a GEMM over them (one multiply-add each per
    // sample), its weights streamed once per kernel.
    const double parameters = static_cast<double>(work.parameters);
    const double parameter_bytes = float_bytes * parameters;
    const double gemm_flops = 2.0 * parameters;
    work.forward = {gemm_flops, float_bytes * (in + out), parameter_bytes, 2};
    work.backward_weights = {gemm_flops, float_bytes * (out + in), 2 * parameter_bytes, 2};
    work.backward_input = {gemm_flops, float_bytes * (out + in), parameter_bytes, 2};
    charge_parameters(&work, 2, training);
  } else if (spec.type == "flatten") {
    // A view: no kernel.
  } else if (spec.type == "maxpool2d") {
    work.forward = {in, float_bytes * (in + 2 * out), 0, 1};
    work.backward_input = {in, float_bytes * (2 * in + 2 * out), 0, 2};
  } else if (spec.type == "dropout") {
    work.forward = {2 * out, float_bytes * 3 * out, 0, 1};
    work.backward_input = {out, float_bytes * 3 * out, 0, 1};
  } else {  // activations
    work.forward = {elementwise_flops(spec.type) * out, float_bytes * 2 * out, 0, 1};
    work.backward_input = {2 * elementwise_flops(spec.type) * out, float_bytes * 4 * out, 0, 1};
  }
  return work;
}

}  // namespace

kernel_work loss_work(int64_t classes) {
  const double c = static_cast<double>(classes);
  return {10 * c, float_bytes * 3 * c, 0, 2};
}

std::optional<std::vector<block_work>> model_work(const actors::job_config& config,
                                                  std::string* error) {
  auto shapes = layers::infer_shapes(config.model.layers, config.model.input_shape, error);
  if (!shapes) return std::nullopt;
  std::vector<block_work> blocks;
  layers::shape input = config.model.input_shape;
  for (size_t i = 0; i < config.model.layers.size(); ++i) {
    blocks.push_back(work_of(config.model.layers[i], input, (*shapes)[i], config));
    input = (*shapes)[i];
  }
  return blocks;
}

std::optional<std::vector<block_work>> node_work(const actors::graph_node_spec& node,
                                                 int64_t blocks_input,
                                                 const actors::job_config& config,
                                                 std::string* error) {
  std::vector<block_work> blocks;
  layers::shape input{blocks_input};
  for (const layers::layer_spec& spec : node.layers) {
    layers::shape output;
    if (!layers::infer_output_shape(spec, input, &output, error)) return std::nullopt;
    blocks.push_back(work_of(spec, input, output, config));
    input = output;
  }
  return blocks;
}

stage_cost::stage_cost(std::vector<block_work> blocks, kernel_work loss, device_model device)
    : blocks_(std::move(blocks)), loss_(loss), device_(std::move(device)) {
  for (const block_work& block : blocks_) {
    state_bytes_ += block.state_bytes;
    parameters_ += block.parameters;
    context_bytes_per_sample_ += float_bytes * static_cast<double>(block.context_elements);
  }
}

double stage_cost::parameter_copy_s() const {
  const double floats = static_cast<double>(parameters_);
  if (parameter_copy_s_per_float_ > 0) return floats * parameter_copy_s_per_float_;
  return float_bytes * floats / (device_.memory_bandwidth * std::max(1e-9, device_.efficiency));
}

double stage_cost::seconds(const kernel_work& work, int64_t batch) const {
  if (work.kernels == 0) return 0;
  const double n = static_cast<double>(batch);
  const double compute = work.flops_per_sample * n / (device_.peak_flops * device_.efficiency);
  const double memory = (work.bytes_per_sample * n + work.fixed_bytes) /
                        (device_.memory_bandwidth * device_.efficiency);
  return std::max(compute, memory) + work.kernels * device_.launch_overhead_s;
}

void stage_cost::use_measured(std::vector<block_profile> measured, int64_t batch, double loss_s,
                              int64_t evaluation_batch) {
  measured_ = std::move(measured);
  measured_batch_ = batch;
  measured_loss_s_ = loss_s;
  evaluation_batch_ = evaluation_batch;
}

double stage_cost::measured(double seconds, int64_t batch) const {
  return seconds * static_cast<double>(batch) / static_cast<double>(measured_batch_);
}

double stage_cost::forward_s(int64_t batch, bool training) const {
  double total = 0;
  if (!measured_.empty()) {
    const bool evaluated = !training && evaluation_batch_ > 0;
    for (const block_profile& block : measured_) {
      total += evaluated && block.evaluate_s > 0 ? block.evaluate_s * static_cast<double>(batch) /
                                                       static_cast<double>(evaluation_batch_)
                                                 : measured(block.forward_s, batch);
    }
    return total;
  }
  for (const block_work& block : blocks_) total += seconds(block.forward, batch);
  return total;
}

double stage_cost::loss_s(int64_t batch) const {
  return measured_.empty() ? seconds(loss_, batch) : measured(measured_loss_s_, batch);
}

double stage_cost::backward_s(int64_t batch, bool need_input_gradient) const {
  double total = 0;
  bool parameters_before = false;
  for (size_t i = 0; i < blocks_.size(); ++i) {  // measured_, when set, has as many
    // On the first stage, blocks up to the first with parameters need no input gradient.
    const bool input_gradient = need_input_gradient || parameters_before;
    parameters_before = parameters_before || blocks_[i].parameters > 0;
    if (!measured_.empty()) {
      const block_profile& block = measured_[i];
      total += measured(input_gradient ? block.backward_s : block.backward_first_s, batch);
      continue;
    }
    total += seconds(blocks_[i].backward_weights, batch);
    if (input_gradient) total += seconds(blocks_[i].backward_input, batch);
  }
  return total;
}

/// Blocks whose layers split their backward pass (layers::layer::splits_backward).
static bool splits_backward(const std::string& type) {
  return type == "linear" || type == "conv2d" || type == "lm_head" || layers::is_cut_part(type);
}

double stage_cost::deferred_weights_s(int64_t batch) const {
  double total = 0;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (!splits_backward(blocks_[i].type)) continue;
    // Measured: the backward without the input gradient is the weight gradients alone.
    total += measured_.empty() ? seconds(blocks_[i].backward_weights, batch)
                               : measured(measured_[i].backward_first_s, batch);
  }
  return total;
}

double stage_cost::step_s() const {
  double total = 0;
  if (!measured_.empty()) {
    for (const block_profile& block : measured_) total += block.step_s;
    return total;
  }
  for (const block_work& block : blocks_) total += seconds(block.step, 1);
  return total;
}

double stage_cost::predict_s() const {
  double total = 0;
  for (const block_profile& block : measured_) total += block.predict_s;
  return total > 0 ? total : 2 * stash_s();
}

double stage_cost::stash_s() const {
  double total = 0;
  if (!measured_.empty()) {
    for (const block_profile& block : measured_) total += block.stash_s;
    return total;
  }
  for (const block_work& block : blocks_) total += seconds(block.stash, 1);
  return total;
}

}  // namespace troupe::sim
