#include <algorithm>
#include <map>
#include <unordered_map>

#include "actors/engine/sequential_trainer.h"
#include "actors/engine/stage_device.h"
#include "actors/engine/stage_settings.h"
#include "layers/check.h"
#include "layers/loss.h"
#include "layers/model.h"
#include "layers/optimizer.h"

namespace troupe::actors {
namespace {

/// A stage's blocks of the model on a backend, with one forward context per key in flight.
///
/// All of its work goes to a stream of its own, so that stages sharing a GPU (in one process,
/// or as separate backends on one device) run side by side. Every method synchronizes that
/// stream before it returns (see stage_device.h), which is what makes handing its tensors to
/// anyone else safe on CUDA, where streams are not ordered with each other:
/// - a returned activation or gradient is read by the wire encoder (on the backend's default
///   stream) or, in a local pipeline, by the next stage on that stage's stream;
/// - parameters are read by snapshots and checkpoints on whatever stream the reader has;
/// - tensors freed during a call (temporaries, contexts) go back to the backend's pool at once
///   (CUDA frees on a stream of its own), and another stream of the same backend may be handed
///   that memory next; once the call has synchronized, no kernel still uses it.
/// On the CPU every operation has finished when it returns, so the synchronizations cost
/// nothing there.
class layers_stage_device final : public stage_device {
 public:
  layers_stage_device(const job_config& config, stage_range range, layers::backend& device)
      : device_(device),
        stream_(device.create_stream()),
        seed_(config.training.seed),
        range_(range),
        stages_(config.parallelism.stages),
        recompute_(config.parallelism.recompute) {
    device.set_gemm_precision(stream_, config.training.precision);
    layers::shape input(config.model.input_shape.begin(), config.model.input_shape.end());
    model_ = std::make_unique<layers::sequential>(device, stream_, config.model.layers, input,
                                                  range.first, range.last, seed_);
    std::string error;
    auto shapes = layers::infer_shapes(config.model.layers, input, &error);
    TROUPE_CHECK(shapes.has_value());
    labels_per_sample_ = layers::labels_per_sample(shapes->back());
    layers::optimizer_settings optimizer = optimizer_settings_of(config.training);
    // The delay-corrected Nesterov method's look-ahead (stage_settings::nesterov_momentum).
    optimizer.nesterov = optimizer.nesterov || nesterov_correction(config);
    optimizer_ = std::make_unique<layers::optimizer>(stream_, optimizer, model_->parameters());
    for (size_t i = 0; i < model_->size(); ++i) {
      const layers::layer_spec& spec = config.model.layers[range.first + i];
      // The parts of a cut linear layer are named as the layer is.
      const size_t index = spec.origin >= 0 ? static_cast<size_t>(spec.origin) : range.first + i;
      const std::string layer = layers::uncut_type(spec.type) + std::to_string(index);
      for (layers::parameter* p : model_->at(i).parameters())
        names_.push_back(layer + "." + p->name);
    }
    device_.synchronize(stream_);  // the initial weights are written on stream_
    resting_bytes_ = device_.bytes_in_use();
    device_.reset_peak_bytes();
  }

  /// The weights, contexts and stashes are freed after this, with no work left that uses them.
  ~layers_stage_device() override {
    device_.synchronize(stream_);
    device_.destroy_stream(stream_);
  }
  layers_stage_device(const layers_stage_device&) = delete;
  layers_stage_device& operator=(const layers_stage_device&) = delete;

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

  layers::tensor forward(const key_message& message, bool training) override {
    // Evaluation batches are larger than training keys: their temporaries stay out of the
    // training peak.
    if (!training) note_peak(), device_.reset_peak_bytes();
    layers::run_options options = options_for(message, training);
    std::vector<layers::tensor> current = swap_in_stashed_weights();
    layers::tensor output =
        model_->forward(options, message.payload, training ? &contexts_[message.key] : nullptr);
    if (!current.empty()) restore(current);
    device_.synchronize(stream_);
    if (!training) device_.reset_peak_bytes();
    return output;
  }

  loss_result loss(const layers::tensor& logits, const std::vector<int32_t>& labels, float scale,
                   bool want_gradient) override {
    layers::int_tensor label_tensor(device_, static_cast<int64_t>(labels.size()));
    label_tensor.copy_from_host(stream_, labels.data());
    layers::loss_output output =
        layers::softmax_cross_entropy(stream_, logits, label_tensor, scale, want_gradient);
    // read_totals() synchronizes stream_, after the gradient was written.
    layers::loss_totals totals = layers::read_totals(stream_, output);
    return {output.gradient, totals.loss_sum, totals.correct};
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

  double squared_gradient_norm() override { return optimizer_->squared_gradient_norm(stream_); }

  void step(float learning_rate, float gradient_scale, float momentum) override {
    optimizer_->step(stream_, learning_rate, gradient_scale, momentum);
    device_.synchronize(stream_);
  }

  void stash_weights(int64_t version) override {
    std::vector<layers::tensor>& copies = stash_[version];
    copies.clear();
    for (layers::parameter* p : model_->parameters()) copies.push_back(p->value.clone(stream_));
    device_.synchronize(stream_);
  }

  void stash_predicted_weights(int64_t version, float distance) override {
    stash_weights(version);
    const layers::optimizer_settings& settings = optimizer_->settings();
    if (settings.kind != layers::optimizer_kind::sgd || settings.momentum == 0) return;
    std::vector<layers::tensor>& copies = stash_[version];
    for (size_t i = 0; i < copies.size(); ++i) {
      const std::vector<layers::tensor>& state = optimizer_->state(i);
      if (state.empty()) continue;
      device_.axpy(stream_, -distance, state[0].data(), copies[i].data(),
                   static_cast<size_t>(copies[i].size()));
    }
    device_.synchronize(stream_);
  }

  void use_weights(int64_t version) override { next_pass_version_ = version; }

  void release_weights_before(int64_t version) override {
    stash_.erase(stash_.begin(), stash_.lower_bound(version));
  }

  size_t held_contexts() const override { return contexts_.size() + pending_weights_.size(); }

  int64_t peak_activation_bytes() const override {
    return std::max<int64_t>(0, std::max(training_peak_, device_.peak_bytes()) - resting_bytes_);
  }

  std::vector<layers::parameter*> parameters() override { return model_->parameters(); }

  stage_state save_state() override {
    stage_state state;
    state.stages = stages_;
    state.first_block = static_cast<int64_t>(range_.first);
    state.last_block = static_cast<int64_t>(range_.last);
    state.seed = seed_;
    state.optimizer_steps = optimizer_->steps_taken();
    auto parameters = model_->parameters();
    for (size_t i = 0; i < parameters.size(); ++i) {
      const layers::parameter& p = *parameters[i];
      state.parameters.push_back({names_[i], p.value.dims(), p.value.to_host(stream_)});
      if (p.has_gradient) {
        state.gradients.push_back({names_[i], p.gradient.dims(), p.gradient.to_host(stream_)});
      }
      const std::vector<layers::tensor>& extra = optimizer_->state(i);
      for (size_t k = 0; k < extra.size(); ++k) {
        state.optimizer_state.push_back(
            {names_[i] + optimizer_suffix(k), extra[k].dims(), extra[k].to_host(stream_)});
      }
    }
    return state;
  }

  bool load_state(const stage_state& state, bool weights_only, std::string* error) override {
    auto parameters = model_->parameters();
    std::vector<std::pair<const named_tensor*, layers::tensor*>> copies;
    if (!match_weights(state.parameters, parameters, error, &copies)) return false;
    std::vector<bool> has_gradient(parameters.size(), false);
    if (!weights_only) {
      for (const named_tensor& gradient : state.gradients) {
        const size_t i = index_of(gradient.name);
        if (i == names_.size() || gradient.dims != parameters[i]->gradient.dims()) {
          *error = "gradient " + gradient.name + " does not fit this stage";
          return false;
        }
        has_gradient[i] = true;
        copies.push_back({&gradient, &parameters[i]->gradient});
      }
      for (const named_tensor& extra : state.optimizer_state) {
        bool found = false;
        for (size_t i = 0; i < parameters.size() && !found; ++i) {
          std::vector<layers::tensor>& tensors = optimizer_->state(i);
          for (size_t k = 0; k < tensors.size() && !found; ++k) {
            if (names_[i] + optimizer_suffix(k) != extra.name) continue;
            if (extra.dims != tensors[k].dims()) break;
            copies.push_back({&extra, &tensors[k]});
            found = true;
          }
        }
        if (!found) {
          *error = "optimizer tensor " + extra.name + " does not fit this stage's " +
                   to_string(optimizer_->settings().kind) + " optimizer";
          return false;
        }
      }
    }
    for (auto& [source, target] : copies) target->copy_from_host(stream_, source->values.data());
    device_.synchronize(stream_);
    if (!weights_only) {
      for (size_t i = 0; i < parameters.size(); ++i) parameters[i]->has_gradient = has_gradient[i];
      optimizer_->set_steps_taken(state.optimizer_steps);
    }
    contexts_.clear();
    pending_weights_.clear();
    stash_.clear();
    next_pass_version_ = -1;
    return true;
  }

 private:
  void note_peak() { training_peak_ = std::max(training_peak_, device_.peak_bytes()); }

  layers::run_options options_for(const key_message& message, bool training) const {
    return {stream_, training ? layers::pass_mode::training : layers::pass_mode::evaluation,
            step_seed(seed_, message.step), static_cast<uint64_t>(message.sample_offset),
            recompute_};
  }

  /// Puts the stashed weights of the version named by use_weights() in place; returns the
  /// current ones to restore (empty when nothing was swapped).
  std::vector<layers::tensor> swap_in_stashed_weights() {
    std::vector<layers::tensor> current;
    if (next_pass_version_ < 0) return current;
    auto found = stash_.find(next_pass_version_);
    next_pass_version_ = -1;
    if (found == stash_.end()) return current;
    auto parameters = model_->parameters();
    for (size_t i = 0; i < parameters.size(); ++i) {
      current.push_back(parameters[i]->value);
      parameters[i]->value = found->second[i];
    }
    return current;
  }

  const char* optimizer_suffix(size_t k) const {
    const bool adam = optimizer_->settings().kind != layers::optimizer_kind::sgd;
    if (adam) return k == 0 ? ".exp_avg" : ".exp_avg_sq";
    return ".velocity";
  }

  size_t index_of(const std::string& name) const {
    return static_cast<size_t>(std::find(names_.begin(), names_.end(), name) - names_.begin());
  }

  /// Pairs every parameter with its tensor in `tensors` (all of them must be there with
  /// their shapes, and nothing else).
  bool match_weights(const std::vector<named_tensor>& tensors,
                     std::vector<layers::parameter*>& parameters, std::string* error,
                     std::vector<std::pair<const named_tensor*, layers::tensor*>>* copies) {
    if (tensors.size() != parameters.size()) {
      *error = std::to_string(tensors.size()) + " weight tensors for a stage with " +
               std::to_string(parameters.size());
      return false;
    }
    for (const named_tensor& tensor : tensors) {
      const size_t i = index_of(tensor.name);
      if (i == names_.size()) {
        *error = "weight " + tensor.name + " is not a parameter of this stage";
        return false;
      }
      layers::tensor* into = &parameters[i]->value;
      if (tensor.dims != into->dims()) {
        *error = "weight " + tensor.name + " has shape " + layers::to_string(tensor.dims) +
                 " but the model's is " + layers::to_string(into->dims());
        return false;
      }
      copies->push_back({&tensor, into});
    }
    return true;
  }

  void restore(const std::vector<layers::tensor>& current) {
    auto parameters = model_->parameters();
    for (size_t i = 0; i < parameters.size(); ++i) parameters[i]->value = current[i];
  }

  layers::backend& device_;
  layers::stream stream_;
  uint64_t seed_;
  stage_range range_;
  int stages_;
  bool recompute_;
  int64_t labels_per_sample_ = 1;
  int64_t resting_bytes_ = 0;       ///< weights, gradients and optimizer state
  int64_t training_peak_ = 0;       ///< the backend's peak bytes outside evaluation passes
  std::vector<std::string> names_;  ///< "linear2.weight", parallel to model_->parameters()
  std::unique_ptr<layers::sequential> model_;
  std::unique_ptr<layers::optimizer> optimizer_;
  std::unordered_map<uint64_t, layers::sequential_context> contexts_;
  /// Keys whose backward_input() ran and whose weight gradients wait for backward_weights().
  struct pending_weight_work {
    layers::sequential_context context;
    layers::run_options options;  ///< the key's backward pass's
  };
  std::unordered_map<uint64_t, pending_weight_work> pending_weights_;
  std::map<int64_t, std::vector<layers::tensor>> stash_;
  int64_t next_pass_version_ = -1;
};

}  // namespace

std::unique_ptr<stage_device> make_layers_stage_device(const job_config& config, stage_range range,
                                                       layers::backend& device) {
  return std::make_unique<layers_stage_device>(config, range, device);
}

}  // namespace troupe::actors
