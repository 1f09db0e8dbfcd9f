#pragma once

// The timed devices of a job's stages (timed_stage_device.h), each with its cost model: the
// blocks of a chain (model.layers) or the nodes of a graph (model.nodes), charged by the
// roofline model or by a calibrated profile, which must describe the job's own model.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/engine/graph_program.h"
#include "actors/engine/partition.h"
#include "actors/engine/stage_device.h"
#include "layers/tensor.h"
#include "sim/cluster_model.h"
#include "sim/cost_model.h"
#include "sim/profile.h"
#include "sim/timed_stage_device.h"

namespace troupe::sim {

class stage_device_maker {
 public:
  /// What `config`'s stages are built from (`config` must outlive the maker); nothing, with `error`
  /// set, when the model's shapes do not chain or `profile` (when given) does not time this model's
  /// blocks or nodes.
  static std::optional<stage_device_maker> make(const actors::job_config& config,
                                                const std::optional<machine_profile>& profile,
                                                std::string* error);

  /// The device of the stage of `range` on `device`, computing on `numerics` when given.
  std::unique_ptr<timed_stage_device> stage(actors::stage_range range, const device_model& device,
                                            std::unique_ptr<actors::stage_device> numerics) const;

 private:
  stage_device_maker(const actors::job_config& config,
                     const std::optional<machine_profile>& profile)
      : config_(&config), profile_(profile) {}
  bool check_profile(std::string* error) const;
  std::unique_ptr<timed_stage_device> chain_stage(
      actors::stage_range range, const device_model& device,
      std::unique_ptr<actors::stage_device> numerics) const;
  std::unique_ptr<timed_stage_device> graph_stage(
      actors::stage_range range, const device_model& device,
      std::unique_ptr<actors::stage_device> numerics) const;

  const actors::job_config* config_;
  std::optional<machine_profile> profile_;
  // A chain: every block's work and output shape.
  std::vector<block_work> work_;
  std::vector<layers::shape> shapes_;
  // A graph: its nodes in the order rows visit them.
  std::optional<actors::ordered_graph> graph_;
};

}  // namespace troupe::sim
