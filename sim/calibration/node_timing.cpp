#include "sim/calibration/node_timing.h"

#include <algorithm>
#include <memory>
#include <string>

#include "actors/engine/graph_program.h"
#include "actors/engine/stage_device.h"
#include "layers/check.h"
#include "layers/random.h"
#include "sim/calibration/block_timing.h"
#include "sim/calibration/measuring.h"
#include "sim/graph_cost.h"

namespace troupe::sim {
namespace {

/// `count` sequences of `length` parts each (tokens 0, one label per part): a loop or tree node
/// visits each key of them `length` times, `count` rows each time (a tree node's second child
/// is missing, zeros, which it gathers all the same).
std::shared_ptr<const std::vector<layers::instance>> uniform_instances(int64_t count,
                                                                       int64_t length) {
  layers::instance item;
  item.tokens.assign(static_cast<size_t>(length), 0);
  item.labels.assign(static_cast<size_t>(length), 0);
  return std::make_shared<const std::vector<layers::instance>>(static_cast<size_t>(count), item);
}

/// What a node_timer times: a training round, or an evaluation forward.
enum class timed_passes { training, evaluation };

/// One node's stage timed on keys whose visits all have one row count.
class node_timer {
 public:
  node_timer(const actors::job_config& config, const actors::ordered_graph& graph, size_t node,
             layers::backend& device, int64_t rows, int64_t visits, timed_passes passes)
      : device_(device),
        stage_(actors::make_layers_stage_device(config, {node, node + 1}, device)),
        visits_(graph.nodes[node].route == actors::node_route::chain ? 1 : visits),
        passes_(passes),
        predict_(engine_settings(config).predict_weights) {
    std::string error;
    auto cost = graph_stage_cost::make(config, graph, {node, node + 1}, device_model{}, &error);
    TROUPE_CHECK(cost.has_value());
    forward_.instances = uniform_instances(rows, visits_);
    const actors::key_layout layout = actors::layout_of(*forward_.instances);
    forward_.kind =
        passes == timed_passes::training ? actors::key_kind::forward : actors::key_kind::evaluate;
    forward_.payload = batched(device, {cost->input_width()}, cost->input_rows(layout));
    backward_ = forward_;
    backward_.kind = actors::key_kind::backward;
    backward_.payload = batched(device, {cost->output_width()}, cost->output_rows(layout));
    // An untimed round first: the first calls allocate the node's buffers and gradients.
    if (passes == timed_passes::evaluation) {
      stage_->forward(forward_, false);
      return;
    }
    stage_->forward(forward_, true);
    stage_->backward(backward_, true);
    stage_->step(kTimedStepLearningRate);
  }

  void round() {
    const uint64_t round = ++rounds_;
    const double visits = static_cast<double>(visits_);
    if (passes_ == timed_passes::evaluation) {
      evaluate_s_.push_back(timed(device_, [&] { stage_->forward(forward_, false); }) / visits);
      return;
    }
    forward_.key = backward_.key = round;
    forward_s_.push_back(timed(device_, [&] { stage_->forward(forward_, true); }) / visits);
    const bool input_gradient = round % 2 == 1;
    const double took = timed(device_, [&] { stage_->backward(backward_, input_gradient); });
    (input_gradient ? backward_s_ : first_s_).push_back(took / visits);
    const auto version = static_cast<int64_t>(round);
    stash_s_.push_back(timed(device_, [&] { stage_->stash_weights(version); }));
    if (predict_) {
      predict_s_.push_back(
          timed(device_, [&] { stage_->stash_predicted_weights(version, predicted_distance); }));
    }
    stage_->release_weights_before(version);
    step_s_.push_back(timed(device_, [&] { stage_->step(kTimedStepLearningRate); }));
  }

  uint64_t rounds() const { return rounds_; }
  /// Rounds enough for a median: six, or three of keys of many visits each (each round's time
  /// per visit is already a mean over them) and of evaluation forwards.
  uint64_t least_rounds() const {
    return visits_ >= 8 || passes_ == timed_passes::evaluation ? 3 : 6;
  }
  bool training() const { return passes_ == timed_passes::training; }
  double forward_s() const { return median(forward_s_); }
  double backward_s() const { return median(backward_s_); }
  double backward_first_s() const { return median(first_s_); }
  double evaluate_s() const { return median(evaluate_s_); }
  /// The step, stash and predicted copy, which do not depend on the rows: every timer's together.
  void add_weight_work(std::vector<double>* step, std::vector<double>* stash,
                       std::vector<double>* predict) const {
    step->insert(step->end(), step_s_.begin(), step_s_.end());
    stash->insert(stash->end(), stash_s_.begin(), stash_s_.end());
    predict->insert(predict->end(), predict_s_.begin(), predict_s_.end());
  }

 private:
  layers::backend& device_;
  std::unique_ptr<actors::stage_device> stage_;
  const int64_t visits_;
  const timed_passes passes_;
  const bool predict_;
  actors::key_message forward_, backward_;
  uint64_t rounds_ = 0;
  std::vector<double> forward_s_, backward_s_, first_s_, evaluate_s_, step_s_, stash_s_, predict_s_;
};

/// Runs rounds of `timers` in turn, each until it has had an equal share of `seconds` and its
/// least rounds: a slow spell of the machine slows all of them alike, and a visit of few rows,
/// which takes little, is timed many times over (a loaded machine's medians need them).
void take_turns(std::vector<node_timer>& timers, double seconds) {
  const double share = seconds / static_cast<double>(timers.size());
  std::vector<double> spent(timers.size(), 0.0);
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < timers.size(); ++i) {
      if (timers[i].rounds() >= timers[i].least_rounds() && spent[i] >= share) continue;
      const auto begin = clock_type::now();
      timers[i].round();
      spent[i] += seconds_since(begin);
      more = true;
    }
  }
}

}  // namespace

std::vector<std::vector<layers::instance>> sample_keys(const layers::instance_dataset& train,
                                                       int64_t instances_per_key, int count,
                                                       uint64_t seed) {
  std::vector<std::vector<layers::instance>> keys(static_cast<size_t>(count));
  const auto size = static_cast<uint64_t>(train.count());
  uint64_t draw = 0;
  for (auto& key : keys) {
    for (int64_t i = 0; i < instances_per_key && size > 0; ++i) {
      const uint64_t at = layers::mix64(seed ^ layers::mix64(draw++)) % size;
      key.push_back(train.instances[static_cast<size_t>(at)]);
    }
  }
  return keys;
}

std::vector<int64_t> timed_rows(const std::vector<int64_t>& visit_rows, size_t most_points) {
  if (visit_rows.empty()) return {1};
  const int64_t fewest =
      std::max<int64_t>(1, *std::min_element(visit_rows.begin(), visit_rows.end()));
  const int64_t most =
      std::max<int64_t>(1, *std::max_element(visit_rows.begin(), visit_rows.end()));
  int64_t power = 1;
  while (power * 2 <= fewest) power *= 2;
  std::vector<int64_t> rows;
  for (; power < most; power *= 2) rows.push_back(power);
  rows.push_back(most);
  if (rows.size() > most_points) rows.erase(rows.begin(), rows.end() - most_points);
  return rows;
}

node_profile time_node(const actors::job_config& config, const node_timing_plan& plan,
                       layers::backend& device, double seconds) {
  std::string error;
  const auto graph = actors::ordered_graph_of(config, &error);
  TROUPE_CHECK(graph.has_value());
  const bool evaluations = !plan.evaluation_rows.empty();
  std::vector<node_timer> timers;
  timers.reserve(plan.rows.size() + plan.evaluation_rows.size());
  for (int64_t rows : plan.rows) {
    timers.emplace_back(config, *graph, plan.node, device, rows, plan.visits_per_key,
                        timed_passes::training);
    if (!evaluations) {
      timers.emplace_back(config, *graph, plan.node, device, rows, plan.visits_per_key,
                          timed_passes::evaluation);
    }
  }
  for (int64_t rows : plan.evaluation_rows) {
    timers.emplace_back(config, *graph, plan.node, device, rows, plan.evaluation_visits_per_key,
                        timed_passes::evaluation);
  }
  take_turns(timers, seconds);
  node_profile node;
  node.name = graph->nodes[plan.node].name;
  node.rows = plan.rows;
  node.evaluation_rows = plan.evaluation_rows;
  std::vector<double> step, stash, predict;
  for (const node_timer& timer : timers) {
    if (!timer.training()) {
      node.evaluate_s.push_back(timer.evaluate_s());
      continue;
    }
    node.forward_s.push_back(timer.forward_s());
    node.backward_s.push_back(timer.backward_s());
    node.backward_first_s.push_back(timer.backward_first_s());
    timer.add_weight_work(&step, &stash, &predict);
  }
  node.step_s = median(step);
  node.stash_s = median(stash);
  node.predict_s = median(predict);
  return node;
}

}  // namespace troupe::sim
