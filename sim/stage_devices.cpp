#include "sim/stage_devices.h"

#include "layers/check.h"
#include "layers/model.h"

namespace troupe::sim {

std::optional<stage_device_maker> stage_device_maker::make(
    const actors::job_config& config, const std::optional<machine_profile>& profile,
    std::string* error) {
  stage_device_maker maker(config, profile);
  if (config.model.nodes.empty()) {
    auto work = model_work(config, error);
    if (!work) return std::nullopt;
    auto shapes = layers::infer_shapes(config.model.layers, config.model.input_shape, error);
    if (!shapes) return std::nullopt;
    maker.work_ = std::move(*work);
    maker.shapes_ = std::move(*shapes);
  } else {
    maker.graph_ = actors::ordered_graph_of(config, error);
    if (!maker.graph_) return std::nullopt;
    for (size_t n = 0; n < maker.graph_->nodes.size(); ++n) {
      if (!node_work(maker.graph_->nodes[n], maker.graph_->widths[n].blocks_input, config, error))
        return std::nullopt;
    }
  }
  if (profile && !maker.check_profile(error)) return std::nullopt;
  return maker;
}

bool stage_device_maker::check_profile(std::string* error) const {
  const machine_profile& profile = *profile_;
  if (graph_) {
    const auto& nodes = graph_->nodes;
    if (profile.nodes.size() != nodes.size()) {
      *error = "the profile times " + std::to_string(profile.nodes.size()) +
               " graph nodes but the job's model has " + std::to_string(nodes.size()) +
               ": calibrate with this job";
      return false;
    }
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (profile.nodes[n].name != nodes[n].name) {
        *error = "the profile's node " + std::to_string(n) + " is \"" + profile.nodes[n].name +
                 "\", the job's \"" + nodes[n].name + "\": calibrate with this job";
        return false;
      }
    }
    return true;
  }
  const auto& layers = config_->model.layers;
  if (profile.blocks.size() != layers.size()) {
    *error = "the profile times " + std::to_string(profile.blocks.size()) +
             " blocks but the job's model has " + std::to_string(layers.size()) +
             ": calibrate with this job";
    return false;
  }
  for (size_t b = 0; b < layers.size(); ++b) {
    if (profile.blocks[b].type != layers[b].type) {
      *error = "the profile's block " + std::to_string(b) + " is a " + profile.blocks[b].type +
               ", the job's a " + layers[b].type + ": calibrate with this job";
      return false;
    }
  }
  return true;
}

std::unique_ptr<timed_stage_device> stage_device_maker::stage(
    actors::stage_range range, const device_model& device,
    std::unique_ptr<actors::stage_device> numerics) const {
  return graph_ ? graph_stage(range, device, std::move(numerics))
                : chain_stage(range, device, std::move(numerics));
}

std::unique_ptr<timed_stage_device> stage_device_maker::chain_stage(
    actors::stage_range range, const device_model& device,
    std::unique_ptr<actors::stage_device> numerics) const {
  const bool last = range.last == work_.size();
  const int64_t classes = layers::element_count(shapes_.back());
  std::vector<block_work> blocks(work_.begin() + range.first, work_.begin() + range.last);
  stage_cost cost(std::move(blocks), last ? loss_work(classes) : kernel_work{}, device);
  if (profile_) {
    const machine_profile& profile = *profile_;
    const auto& measured = profile.blocks;
    cost.use_measured({measured.begin() + range.first, measured.begin() + range.last},
                      profile.batch, last ? profile.loss_s : 0, profile.evaluation_batch);
    cost.use_measured_parameter_copy(profile.parameter_copy_s_per_float);
  }
  const layers::shape input =
      range.first == 0 ? layers::shape(config_->model.input_shape) : shapes_[range.first - 1];
  return std::make_unique<timed_stage_device>(std::move(cost), input, shapes_[range.last - 1],
                                              std::move(numerics));
}

std::unique_ptr<timed_stage_device> stage_device_maker::graph_stage(
    actors::stage_range range, const device_model& device,
    std::unique_ptr<actors::stage_device> numerics) const {
  std::string error;
  auto graph = graph_stage_cost::make(*config_, *graph_, range, device, &error);
  TROUPE_CHECK(graph.has_value());  // make() checked every node's blocks
  stage_cost cost(graph->blocks(), kernel_work{}, device);
  if (profile_) {
    const machine_profile& profile = *profile_;
    const auto& nodes = profile.nodes;
    graph->use_measured({nodes.begin() + range.first, nodes.begin() + range.last}, profile.loss_s,
                        profile.loss_rows > 0 ? profile.loss_rows : profile.batch);
    cost.use_measured_parameter_copy(profile.parameter_copy_s_per_float);
  }
  return std::make_unique<timed_stage_device>(std::move(cost), std::move(*graph),
                                              std::move(numerics));
}

}  // namespace troupe::sim
