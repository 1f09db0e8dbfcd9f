#include <unordered_map>

#include "actors/engine/graph_stage_device.h"
#include "actors/engine/model_stage_device.h"
#include "layers/check.h"
#include "layers/loss.h"
#include "layers/model.h"

namespace troupe::actors {
namespace {

/// A stage's blocks of the model on a backend, with one forward context per key in flight.
class layers_stage_device final : public model_stage_device {
 public:
  layers_stage_device(const job_config& config, stage_range range, layers::backend& device)
      : model_stage_device(config, range, device) {
    layers::shape input(config.model.input_shape.begin(), config.model.input_shape.end());
    model_ = std::make_unique<layers::sequential>(device, stream_, config.model.layers, input,
                                                  range.first, range.last, seed_);
    std::string error;
    auto shapes = layers::infer_shapes(config.model.layers, input, &error);
    TROUPE_CHECK(shapes.has_value());
    labels_per_sample_ = layers::labels_per_sample(shapes->back());
    std::vector<std::string> names;
    for (size_t i = 0; i < model_->size(); ++i) {
      const layers::layer_spec& spec = config.model.layers[range.first + i];
      // The parts of a cut linear layer are named as the layer is.
      const size_t index = spec.origin >= 0 ? static_cast<size_t>(spec.origin) : range.first + i;
      const std::string layer = layers::uncut_type(spec.type) + std::to_string(index);
      for (layers::parameter* p : model_->at(i).parameters())
        names.push_back(layer + "." + p->name);
    }
    adopt_parameters(model_->parameters(), std::move(names), config);
  }

  bool accepts(const key_message& message, std::string* error) const override {
    const bool backward = message.kind == key_kind::backward;
    const layers::shape& sample = backward ? model_->output_shape() : model_->input_shape();
    const layers::shape& dims = message.payload.dims();
    const int64_t batch = dims.empty() ? -1 : dims[0];
    if (message.payload.empty() || batch < 1 ||
        layers::shape(dims.begin() + 1, dims.end()) != sample) {
      *error = "payload " + layers::to_string(dims) + " does not fit the stage's " +
               (backward ? "output " : "input ") + layers::to_string(sample);
      return false;
    }
    if (message.labels &&
        static_cast<int64_t>(message.labels->size()) != batch * labels_per_sample_) {
      *error = std::to_string(message.labels->size()) + " labels for " + std::to_string(batch) +
               " samples of " + std::to_string(labels_per_sample_);
      return false;
    }
    if (!backward) return true;
    auto found = contexts_.find(message.key);
    if (found == contexts_.end()) {
      *error = "backward for key " + std::to_string(message.key) + ", which is not in flight here";
      return false;
    }
    return true;
  }

  int64_t classes() const override { return model_->output_shape().back(); }

  layers::tensor forward(const key_message& message, bool training) override {
    if (!training) begin_evaluation_pass();
    layers::run_options options = options_for(message, training);
    std::vector<layers::tensor> current = swap_in_stashed_weights();
    layers::tensor output =
        model_->forward(options, message.payload, training ? &contexts_[message.key] : nullptr);
    if (!current.empty()) restore(current);
    device_.synchronize(stream_);
    if (!training) end_evaluation_pass();
    return output;
  }

  layers::tensor backward(const key_message& message, bool need_input_gradient) override {
    auto found = contexts_.find(message.key);
    TROUPE_CHECK(found != contexts_.end());
    std::vector<layers::tensor> current = swap_in_stashed_weights();
    layers::tensor gradient = model_->backward(options_for(message, true), found->second,
                                               message.payload, need_input_gradient);
    if (!current.empty()) restore(current);
    contexts_.erase(found);
    device_.synchronize(stream_);
    return gradient;
  }

  layers::tensor backward_input(const key_message& message, bool need_input_gradient) override {
    auto found = contexts_.find(message.key);
    TROUPE_CHECK(found != contexts_.end() && next_pass_version_ < 0);
    layers::tensor gradient = model_->backward_input(options_for(message, true), found->second,
                                                     message.payload, need_input_gradient);
    pending_weights_.emplace(
        message.key, pending_weight_work{std::move(found->second), options_for(message, true)});
    contexts_.erase(found);
    device_.synchronize(stream_);
    return gradient;
  }

  void backward_weights(uint64_t key) override {
    auto found = pending_weights_.find(key);
    TROUPE_CHECK(found != pending_weights_.end());
    model_->backward_weights(found->second.options, found->second.context);
    pending_weights_.erase(found);
    device_.synchronize(stream_);
  }

  size_t held_contexts() const override { return contexts_.size() + pending_weights_.size(); }

 private:
  void forget_keys() override {
    contexts_.clear();
    pending_weights_.clear();
  }

  int64_t labels_per_sample_ = 1;
  std::unique_ptr<layers::sequential> model_;
  std::unordered_map<uint64_t, layers::sequential_context> contexts_;
  /// Keys whose backward_input() ran and whose weight gradients wait for backward_weights().
  struct pending_weight_work {
    layers::sequential_context context;
    layers::run_options options;  ///< the key's backward pass's
  };
  std::unordered_map<uint64_t, pending_weight_work> pending_weights_;
};

}  // namespace

std::unique_ptr<stage_device> make_layers_stage_device(const job_config& config, stage_range range,
                                                       layers::backend& device) {
  if (!config.model.nodes.empty()) return make_graph_stage_device(config, range, device);
  return std::make_unique<layers_stage_device>(config, range, device);
}

}  // namespace troupe::actors
