#include "sim/calibration/graph_calibration.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "actors/config/job_data.h"
#include "actors/engine/graph_program.h"
#include "actors/engine/partition.h"
#include "actors/engine/stage_device.h"
#include "actors/engine/stage_settings.h"
#include "actors/engine/training_run.h"
#include "layers/backend_registry.h"
#include "layers/check.h"
#include "sim/calibration/graph_stage_timing.h"
#include "sim/calibration/measuring.h"
#include "sim/calibration/node_timing.h"
#include "sim/calibration/transport_timing.h"
#include "sim/graph_cost.h"
#include "transport/endpoint.h"

namespace troupe::sim {
namespace {

/// Keys drawn to learn the routes of the job's keys (their visits' rows, their sizes).
constexpr int sampled_keys = 64;
/// A run's evaluation keys looked at, at most.
constexpr size_t evaluated_keys = 8;

/// The middle of `values` (integers).
int64_t median_count(std::vector<int64_t> values) {
  return values.empty() ? 1 : static_cast<int64_t>(median({values.begin(), values.end()}));
}

/// What the sample keys' routes are like at every node, and the key's messages.
struct route_summary {
  std::vector<node_timing_plan> plans;  ///< one per node
  int64_t loss_rows = 1;                ///< a median key's rows at the loss
  /// The biggest message of a median key: the node output of most floats, its rows and width.
  int64_t message_rows = 1;
  int64_t message_width = 1;
};

/// The row counts of the visits of the stage of one node `node` over `keys`, and the median
/// count of visits per key.
std::pair<std::vector<int64_t>, int64_t> visits_of(
    const graph_stage_cost& node, const std::vector<std::vector<layers::instance>>& keys) {
  std::vector<int64_t> rows, visits;
  for (const auto& key : keys) {
    const std::vector<int64_t> visit_rows = node.visit_rows(0, key);
    rows.insert(rows.end(), visit_rows.begin(), visit_rows.end());
    visits.push_back(static_cast<int64_t>(visit_rows.size()));
  }
  return {rows, median_count(visits)};
}

/// The keys a run evaluates on (the held-out set in order, evaluation_batch instances each), at
/// most `most` of them.
std::vector<std::vector<layers::instance>> evaluation_keys(const layers::dataset& test,
                                                           size_t most) {
  std::vector<std::vector<layers::instance>> keys;
  if (!test.instances) return keys;
  const auto& instances = test.instances->instances;
  const auto batch = static_cast<size_t>(actors::evaluation_batch);
  for (size_t first = 0; first < instances.size() && keys.size() < most; first += batch) {
    const size_t last = std::min(instances.size(), first + batch);
    keys.emplace_back(instances.begin() + static_cast<std::ptrdiff_t>(first),
                      instances.begin() + static_cast<std::ptrdiff_t>(last));
  }
  return keys;
}

/// The plans of timing every node at the visits of the training `keys` and of the `evaluated`
/// keys, and the rows of a median key's loss and biggest message.
route_summary summarize_routes(const actors::job_config& config, const actors::ordered_graph& graph,
                               const std::vector<std::vector<layers::instance>>& keys,
                               const std::vector<std::vector<layers::instance>>& evaluated) {
  route_summary summary;
  std::string error;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    auto node = graph_stage_cost::make(config, graph, {n, n + 1}, device_model{}, &error);
    TROUPE_CHECK(node.has_value());  // ordered_graph_of() checked the shapes
    node_timing_plan plan;
    plan.node = n;
    const auto [rows, visits] = visits_of(*node, keys);
    plan.rows = timed_rows(rows);
    plan.visits_per_key = visits;
    if (!evaluated.empty()) {
      const auto [evaluation_rows, evaluation_visits] = visits_of(*node, evaluated);
      plan.evaluation_rows = timed_rows(evaluation_rows);
      plan.evaluation_visits_per_key = evaluation_visits;
    }
    summary.plans.push_back(std::move(plan));
    std::vector<int64_t> emitted;
    for (const auto& key : keys) emitted.push_back(node->output_rows(actors::layout_of(key)));
    const int64_t key_rows = median_count(emitted);
    const int64_t width = node->output_width();
    if (width * key_rows > summary.message_width * summary.message_rows) {
      summary.message_width = width;
      summary.message_rows = key_rows;
    }
    if (n + 1 == graph.nodes.size()) summary.loss_rows = key_rows;
  }
  return summary;
}

/// The loss over `rows` rows of the last node's `classes` outputs, on `device` (the median of
/// repeats for about `seconds`).
double time_loss(const actors::job_config& config, size_t nodes, layers::backend& device,
                 int64_t rows, int64_t classes, double seconds) {
  auto last = actors::make_layers_stage_device(config, {nodes - 1, nodes}, device);
  std::vector<float> logits(static_cast<size_t>(rows * classes), 0.1f);
  std::vector<int32_t> labels(static_cast<size_t>(rows), 0);
  const layers::tensor output =
      layers::tensor::from_host(device, device.default_stream(), {rows, classes}, logits);
  std::vector<double> times;
  const auto start = clock_type::now();
  while (times.size() < 3 || seconds_since(start) < seconds) {
    times.push_back(timed(device, [&] { last->loss(output, labels, 1.0f, true); }));
  }
  return median(times);
}

/// Fits the profile's node tables to the job's stages timed as they train (graph_stage_timing.h)
/// and sets its work_jitter from how far the stages' keys strayed from the fitted model.
bool fit_to_stages(const actors::job_config& config, const actors::ordered_graph& graph,
                   const std::vector<std::vector<layers::instance>>& keys, double seconds,
                   machine_profile* profile, std::string* error) {
  auto ranges = actors::partition_model(config, error);
  if (!ranges) return false;
  auto stages = time_graph_stages(config, graph, *ranges, *profile, keys, seconds, error);
  if (!stages) return false;
  fit_nodes_to_stages(*stages, &profile->nodes);
  std::vector<double> spreads;
  for (const graph_stage_timing& stage : *stages) spreads.push_back(log_spread({&stage.ratios}));
  profile->work_jitter = std::min(1.0, median(spreads));
  return true;
}

}  // namespace

std::optional<machine_profile> calibrate_graph(const actors::job_config& config, double seconds,
                                               std::string* error) {
  auto graph = actors::ordered_graph_of(config, error);
  if (!graph) return std::nullopt;
  auto data = actors::load_job_data(config, error);
  if (!data) return std::nullopt;
  machine_profile profile;
  profile.backend = actors::device_of_stage(config, 0);
  profile.threads = actors::threads_per_stage(config);
  profile.batch = actors::micro_batch_size(config);
  auto device = layers::create_backend(profile.backend, profile.threads, error);
  if (!device) return std::nullopt;
  const size_t nodes = graph->nodes.size();
  const auto keys =
      sample_keys(*data->train.instances, profile.batch, sampled_keys, config.training.seed);
  const route_summary routes =
      summarize_routes(config, *graph, keys, evaluation_keys(data->test, evaluated_keys));
  for (const node_timing_plan& plan : routes.plans)
    profile.nodes.push_back(time_node(config, plan, *device, seconds));
  if (!fit_to_stages(config, *graph, keys, seconds, &profile, error)) return std::nullopt;
  profile.loss_rows = routes.loss_rows;
  profile.loss_s =
      time_loss(config, nodes, *device, routes.loss_rows, graph->widths.back().output, seconds / 4);
  // Keys of the first node's input rows (one token id each) and of the biggest activation.
  if (!time_transport(&profile, *device, {graph->widths.front().input}, {routes.message_width},
                      routes.message_rows, error)) {
    return std::nullopt;
  }
  auto host = layers::create_backend("cpu", 1, error);
  if (!host) return std::nullopt;
  profile.coordinator_s_per_sample =
      coordinator_seconds_per_sample(data->train, profile.batch, *host, seconds);
  return profile;
}

std::optional<std::vector<actors::block_cost>> measure_node_costs(const actors::job_config& config,
                                                                  double seconds,
                                                                  std::FILE* progress,
                                                                  std::string* error) {
  auto graph = actors::ordered_graph_of(config, error);
  if (!graph) return std::nullopt;
  auto data = actors::load_job_data(config, error);
  if (!data) return std::nullopt;
  const int threads = actors::threads_per_stage(config);
  auto device = layers::create_backend(actors::device_of_stage(config, 0), threads, error);
  if (!device) return std::nullopt;
  const size_t nodes = graph->nodes.size();
  if (progress && seconds * static_cast<double>(nodes) > 1.0) {
    std::fprintf(progress, "troupe: timing %zu graph nodes on %s with %d thread(s) for %.1f s\n",
                 nodes, device->name().c_str(), threads, seconds * static_cast<double>(nodes));
  }
  const auto keys = sample_keys(*data->train.instances, actors::micro_batch_size(config),
                                sampled_keys, config.training.seed);
  const route_summary routes = summarize_routes(config, *graph, keys, {});
  transport::transport_context context;
  const double steps_per_key = 1.0 / actors::keys_between_steps(config);
  std::vector<actors::block_cost> costs;
  for (size_t n = 0; n < nodes; ++n) {
    auto node = graph_stage_cost::make(config, *graph, {n, n + 1}, device_model{}, error);
    if (!node) return std::nullopt;
    const node_profile timed_node = time_node(config, routes.plans[n], *device, seconds);
    node->use_measured({timed_node}, 0, 1);
    actors::block_cost cost;
    std::vector<int64_t> emitted;
    for (const auto& key : keys) {
      cost.forward += node->forward_s(key, true);
      cost.backward += node->backward_s(key, false);
      cost.input_gradient += node->backward_s(key, true);
      emitted.push_back(node->output_rows(actors::layout_of(key)));
    }
    const double count = static_cast<double>(std::max<size_t>(1, keys.size()));
    cost.forward /= count;
    cost.backward /= count;
    cost.input_gradient = std::max(0.0, cost.input_gradient / count - cost.backward);
    cost.step = timed_node.step_s * steps_per_key;
    if (n + 1 < nodes) {
      // Sending the node's output and receiving its gradient: two message ends each way.
      const std::string address = "inproc://troupe-node-costs-" + std::to_string(n);
      double latency = 0;
      const double end_s = taken_message_cpu_seconds(
          context, address, *device, {node->output_width()}, median_count(emitted), 30, &latency);
      cost.message = end_s > 0 ? 2 * end_s : 0.0;
    }
    costs.push_back(cost);
  }
  return costs;
}

}  // namespace troupe::sim
