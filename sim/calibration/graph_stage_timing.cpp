#include "sim/calibration/graph_stage_timing.h"

#include <algorithm>
#include <memory>
#include <thread>

#include "actors/engine/stage_device.h"
#include "actors/engine/stage_settings.h"
#include "layers/backend_registry.h"
#include "layers/check.h"
#include "sim/calibration/block_timing.h"
#include "sim/calibration/measuring.h"
#include "sim/calibration/stage_rounds.h"
#include "sim/graph_cost.h"

namespace troupe::sim {
namespace {

/// Keys each stage is timed on at least: their sizes vary, and so does what the model predicts
/// for them.
constexpr size_t min_timed_keys = 12;

/// Times one stage of a graph as a pipeline stage runs it, round by round, on keys of the job's
/// data: their forward passes, their backward passes (the last stage's right after its
/// forward), then a stash where the job stashes weights, a predicted copy where it predicts
/// them, and the step.
class graph_stage_timer {
 public:
  graph_stage_timer(const actors::job_config& config, const actors::ordered_graph& graph,
                    actors::stage_range range, const machine_profile& profile,
                    const std::vector<std::vector<layers::instance>>& keys, layers::backend& device)
      : device_(device),
        stage_(actors::make_layers_stage_device(config, range, device)),
        keys_(keys),
        first_(range.first == 0),
        last_(range.last == graph.nodes.size()),
        keys_per_round_(keys_in_round(config)),
        stash_(config.parallelism.mode == actors::pipeline_mode::async &&
               engine_settings(config).weight_stashing),
        predict_(engine_settings(config).predict_weights && !last_) {
    std::string error;
    auto cost = graph_stage_cost::make(config, graph, range, device_model{}, &error);
    TROUPE_CHECK(cost.has_value());
    cost->use_measured({profile.nodes.begin() + range.first, profile.nodes.begin() + range.last}, 0,
                       1);
    cost_.emplace(std::move(*cost));
    timing_.range = range;
  }

  int keys_per_round() const { return keys_per_round_; }
  bool last() const { return last_; }

  void forward_key(int i) {
    const std::vector<layers::instance>& instances = key_instances(i);
    actors::key_message message = message_of(i, actors::key_kind::forward);
    const double took = timed(device_, [&] { stage_->forward(message, true); });
    note(took, cost_->forward_s(instances, true), &timing_.forward_s, &timing_.predicted_forward_s,
         i);
  }

  void backward_key(int i) {
    const std::vector<layers::instance>& instances = key_instances(i);
    actors::key_message message = message_of(i, actors::key_kind::backward);
    const double took = timed(device_, [&] { stage_->backward(message, !first_); });
    note(took, cost_->backward_s(instances, !first_), &timing_.backward_s,
         &timing_.predicted_backward_s, i);
  }

  void finish_round() {
    next_key_ += static_cast<size_t>(keys_per_round_);
    const auto version = static_cast<int64_t>(++rounds_);
    if (stash_) stash_s_.push_back(timed(device_, [&] { stage_->stash_weights(version); }));
    if (predict_) {
      predict_s_.push_back(
          timed(device_, [&] { stage_->stash_predicted_weights(version, predicted_distance); }));
    }
    stage_->release_weights_before(version);
    step_s_.push_back(timed(device_, [&] { stage_->step(kTimedStepLearningRate); }));
  }

  /// Drops what was timed so far (an untimed first round).
  void forget() {
    const actors::stage_range range = timing_.range;
    timing_ = graph_stage_timing{};
    timing_.range = range;
    step_s_.clear();
    stash_s_.clear();
    predict_s_.clear();
    pending_.assign(pending_.size(), pending_key{});
  }

  size_t rounds() const { return step_s_.size(); }
  graph_stage_timing timing() const {
    graph_stage_timing result = timing_;
    result.step_s = median(step_s_);
    result.stash_s = median(stash_s_);
    result.predict_s = median(predict_s_);
    return result;
  }

 private:
  const std::vector<layers::instance>& key_instances(int i) const {
    return keys_[(next_key_ + static_cast<size_t>(i)) % keys_.size()];
  }

  /// The message of the round's key `i`: its instances and a payload of the stage's rows.
  actors::key_message message_of(int i, actors::key_kind kind) {
    actors::key_message message;
    message.kind = kind;
    message.key = next_key_ + static_cast<uint64_t>(i);
    message.instances = std::make_shared<const std::vector<layers::instance>>(key_instances(i));
    const actors::key_layout layout = actors::layout_of(*message.instances);
    const bool forward = kind == actors::key_kind::forward;
    message.payload = batched(device_, {forward ? cost_->input_width() : cost_->output_width()},
                              forward ? cost_->input_rows(layout) : cost_->output_rows(layout));
    return message;
  }

  /// Adds a pass's time and prediction; the round's key `i` gets its ratio once both of its
  /// passes are in.
  void note(double took, double predicted, double* total, double* predicted_total, int i) {
    *total += took;
    *predicted_total += predicted;
    pending_key& key = pending_[static_cast<size_t>(i)];
    key.seconds += took;
    key.expected += predicted;
    if (++key.passes < 2) return;
    if (key.expected > 0) timing_.ratios.push_back(key.seconds / key.expected);
    key = pending_key{};
  }

  struct pending_key {
    double seconds = 0, expected = 0;
    int passes = 0;
  };
  layers::backend& device_;
  std::unique_ptr<actors::stage_device> stage_;
  std::optional<graph_stage_cost> cost_;
  const std::vector<std::vector<layers::instance>>& keys_;
  const bool first_, last_;
  const int keys_per_round_;
  const bool stash_, predict_;
  size_t next_key_ = 0;
  uint64_t rounds_ = 0;
  graph_stage_timing timing_;
  std::vector<pending_key> pending_ =
      std::vector<pending_key>(static_cast<size_t>(keys_per_round_));
  std::vector<double> step_s_, stash_s_, predict_s_;
};

/// A stage's forward and backward time per key by its node tables, over `keys`.
double predicted_key_s(const actors::job_config& config, const actors::ordered_graph& graph,
                       actors::stage_range range, const machine_profile& profile,
                       const std::vector<std::vector<layers::instance>>& keys) {
  std::string error;
  auto cost = graph_stage_cost::make(config, graph, range, device_model{}, &error);
  TROUPE_CHECK(cost.has_value());
  cost->use_measured({profile.nodes.begin() + range.first, profile.nodes.begin() + range.last}, 0,
                     1);
  double total = 0;
  for (const auto& key : keys) total += cost->forward_s(key, true) + cost->backward_s(key, true);
  return total / static_cast<double>(std::max<size_t>(1, keys.size()));
}

/// Pools the replicas' timings of each stage into the first replica's.
std::vector<graph_stage_timing> pooled(std::vector<graph_stage_timing> timings, size_t stages) {
  for (size_t a = stages; a < timings.size(); ++a) {
    graph_stage_timing& into = timings[a % stages];
    const graph_stage_timing& from = timings[a];
    into.forward_s += from.forward_s;
    into.backward_s += from.backward_s;
    into.predicted_forward_s += from.predicted_forward_s;
    into.predicted_backward_s += from.predicted_backward_s;
    into.ratios.insert(into.ratios.end(), from.ratios.begin(), from.ratios.end());
  }
  timings.resize(stages);
  return timings;
}

}  // namespace

std::optional<std::vector<graph_stage_timing>> time_graph_stages(
    const actors::job_config& config, const actors::ordered_graph& graph,
    const std::vector<actors::stage_range>& ranges, const machine_profile& profile,
    const std::vector<std::vector<layers::instance>>& keys, double seconds, std::string* error) {
  std::vector<actors::stage_range> actor_ranges;
  for (int r = 0; r < config.parallelism.replicas; ++r)
    actor_ranges.insert(actor_ranges.end(), ranges.begin(), ranges.end());
  const int threads = actors::threads_per_stage(config);
  const int groups =
      std::clamp(actors::job_threads(config) / threads, 1, static_cast<int>(actor_ranges.size()));
  std::vector<double> costs;
  for (const actors::stage_range& range : actor_ranges)
    costs.push_back(predicted_key_s(config, graph, range, profile, keys));
  const std::vector<int> group_of = balanced_groups(costs, groups);
  std::vector<std::unique_ptr<layers::backend>> backends;
  for (int g = 0; g < groups; ++g) {
    backends.push_back(layers::create_backend(actors::device_of_stage(config, 0), threads, error));
    if (!backends.back()) return std::nullopt;
  }
  round_barrier barrier(groups);
  std::vector<graph_stage_timing> timings(actor_ranges.size());
  auto time_group = [&](int group) {
    std::vector<size_t> members;
    std::vector<graph_stage_timer> timers;
    double group_seconds = 0;
    for (size_t a = 0; a < actor_ranges.size(); ++a) {
      if (group_of[a] != group) continue;
      members.push_back(a);
      timers.emplace_back(config, graph, actor_ranges[a], profile, keys, *backends[group]);
      group_seconds += seconds * static_cast<double>(actor_ranges[a].last - actor_ranges[a].first);
    }
    const auto round = [&] { run_stage_round(timers); };
    round();
    for (graph_stage_timer& timer : timers) timer.forget();
    barrier.arrive_and_wait(false);
    const auto start = clock_type::now();
    const size_t rounds = std::max<size_t>(
        3, (min_timed_keys + static_cast<size_t>(timers.front().keys_per_round()) - 1) /
               static_cast<size_t>(timers.front().keys_per_round()));
    do {
      round();
    } while (!barrier.arrive_and_wait(timers.front().rounds() >= rounds &&
                                      seconds_since(start) >= group_seconds));
    for (size_t i = 0; i < members.size(); ++i) timings[members[i]] = timers[i].timing();
  };
  std::vector<std::thread> workers;
  for (int g = 1; g < groups; ++g) workers.emplace_back(time_group, g);
  time_group(0);
  for (std::thread& worker : workers) worker.join();
  return pooled(std::move(timings), ranges.size());
}

namespace {

/// Multiplies `field`'s entries of `nodes` [first, last) by `factor` (when it is a factor).
void scale(std::vector<node_profile>& nodes, actors::stage_range range, double factor,
           std::vector<double> node_profile::*field) {
  if (!(factor > 0)) return;
  for (size_t n = range.first; n < range.last; ++n) {
    for (double& seconds : nodes[n].*field) seconds *= factor;
  }
}

/// Scales `field` of `nodes` [first, last) so that they add up to `total` (when they add up to
/// anything at all).
void scale_to(std::vector<node_profile>& nodes, actors::stage_range range, double total,
              double node_profile::*field) {
  double sum = 0;
  for (size_t n = range.first; n < range.last; ++n) sum += nodes[n].*field;
  if (sum <= 0 || total <= 0) return;
  for (size_t n = range.first; n < range.last; ++n) nodes[n].*field *= total / sum;
}

}  // namespace

void fit_nodes_to_stages(const std::vector<graph_stage_timing>& timings,
                         std::vector<node_profile>* nodes) {
  for (const graph_stage_timing& stage : timings) {
    const double forward = stage.predicted_forward_s > 0 && stage.forward_s > 0
                               ? stage.forward_s / stage.predicted_forward_s
                               : 0;
    const double backward = stage.predicted_backward_s > 0 && stage.backward_s > 0
                                ? stage.backward_s / stage.predicted_backward_s
                                : 0;
    scale(*nodes, stage.range, forward, &node_profile::forward_s);
    scale(*nodes, stage.range, forward, &node_profile::evaluate_s);
    scale(*nodes, stage.range, backward, &node_profile::backward_s);
    scale(*nodes, stage.range, backward, &node_profile::backward_first_s);
    scale_to(*nodes, stage.range, stage.step_s, &node_profile::step_s);
    scale_to(*nodes, stage.range, stage.stash_s, &node_profile::stash_s);
    scale_to(*nodes, stage.range, stage.predict_s, &node_profile::predict_s);
  }
}

}  // namespace troupe::sim
