#include "actors/engine/graph_stage_device.h"

#include <limits>
#include <unordered_map>

#include "actors/engine/graph_program.h"
#include "actors/engine/model_stage_device.h"
#include "layers/check.h"

namespace troupe::actors {
namespace {

/// A stage's nodes of a model graph on a backend, with one tape per key in flight.
class graph_stage_device final : public model_stage_device {
 public:
  graph_stage_device(const job_config& config, stage_range range, layers::backend& device)
      : model_stage_device(config, range, device) {
    std::string error;
    auto graph = ordered_graph_of(config, &error);
    TROUPE_CHECK(graph.has_value());
    arity_ = graph->arity;
    program_ = std::make_unique<graph_program>(device, stream_, graph->nodes, graph->widths,
                                               range.first, range.last, arity_, seed_);
    adopt_parameters(program_->parameters(), program_->parameter_names(), config);
  }

  bool accepts(const key_message& message, std::string* error) const override {
    if (!message.instances) {
      *error = "a key of a graph model without its instances";
      return false;
    }
    // The routes trust the instances' structure: a peer's must hold before any is planned.
    layers::instance_dataset bounds;
    bounds.vocabulary = bounds.classes = std::numeric_limits<int>::max();
    bounds.arity = arity_;
    for (size_t i = 0; i < message.instances->size(); ++i) {
      const std::string problem = layers::instance_error(bounds, (*message.instances)[i]);
      if (!problem.empty()) {
        *error = "instance " + std::to_string(i) + " of key " + std::to_string(message.key) + ": " +
                 problem;
        return false;
      }
    }
    const key_layout layout = layout_of(*message.instances);
    const bool backward = message.kind == key_kind::backward;
    const int64_t rows = backward ? program_->output_rows(layout) : program_->input_rows(layout);
    const int64_t width = backward ? program_->output_width() : program_->input_width();
    const layers::shape& dims = message.payload.dims();
    if (message.payload.empty() || dims.size() != 2 || dims[0] != rows || dims[1] != width) {
      *error = "payload " + layers::to_string(dims) + " does not fit the stage's " +
               (backward ? "output " : "input ") + layers::to_string({rows, width}) + " for " +
               std::to_string(layout.instances()) + " instances of " +
               std::to_string(layout.parts()) + " parts";
      return false;
    }
    if (message.labels &&
        static_cast<int64_t>(message.labels->size()) != program_->loss_rows(layout)) {
      *error = std::to_string(message.labels->size()) + " labels where the graph gives the loss " +
               std::to_string(program_->loss_rows(layout)) + " rows";
      return false;
    }
    if (backward && tapes_.find(message.key) == tapes_.end()) {
      *error = "backward for key " + std::to_string(message.key) + ", which is not in flight here";
      return false;
    }
    return true;
  }

  int64_t classes() const override { return program_->output_width(); }

  layers::tensor forward(const key_message& message, bool training) override {
    if (!training) begin_evaluation_pass();
    std::vector<layers::tensor> current = swap_in_stashed_weights();
    layers::tensor output =
        program_->forward(options_for(message, training), message.payload, message.instances,
                          training ? &tapes_[message.key] : nullptr);
    if (!current.empty()) restore(current);
    device_.synchronize(stream_);
    if (!training) end_evaluation_pass();
    return output;
  }

  layers::tensor backward(const key_message& message, bool need_input_gradient) override {
    auto found = tapes_.find(message.key);
    TROUPE_CHECK(found != tapes_.end());
    std::vector<layers::tensor> current = swap_in_stashed_weights();
    layers::tensor gradient = program_->backward(options_for(message, true), found->second,
                                                 message.payload, need_input_gradient);
    if (!current.empty()) restore(current);
    tapes_.erase(found);
    device_.synchronize(stream_);
    return gradient;
  }

  size_t held_contexts() const override { return tapes_.size(); }

 private:
  void forget_keys() override { tapes_.clear(); }

  int arity_ = 1;
  std::unique_ptr<graph_program> program_;
  std::unordered_map<uint64_t, graph_tape> tapes_;
};

}  // namespace

std::unique_ptr<stage_device> make_graph_stage_device(const job_config& config, stage_range range,
                                                      layers::backend& device) {
  return std::make_unique<graph_stage_device>(config, range, device);
}

}  // namespace troupe::actors
