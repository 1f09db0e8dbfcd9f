#include "sim/calibration/block_timing.h"

#include <unistd.h>

#include <algorithm>
#include <memory>

#include "actors/engine/stage_device.h"
#include "actors/engine/stage_settings.h"
#include "actors/engine/training_run.h"
#include "layers/backend_registry.h"
#include "layers/model.h"
#include "sim/calibration/graph_calibration.h"
#include "sim/calibration/measuring.h"

namespace troupe::sim {
namespace {

/// Times one block alone, a round at a time: forward, backward (every other round with the
/// input gradient), a weight stash, a predicted copy where the job predicts weights
/// (staleness_correction = "predict") and the step; and with `evaluation`, evaluation forwards one
/// after another, as a run's evaluation sweeps the held-out set.
class block_timer {
 public:
  block_timer(const actors::job_config& config, size_t index, layers::backend& device,
              const layers::shape& input, int64_t batch, bool evaluation)
      : device_(device),
        type_(config.model.layers[index].type),
        stage_(actors::make_layers_stage_device(config, {index, index + 1}, device)),
        predict_(engine_settings(config).predict_weights) {
    message_.payload = batched(device, input, batch);
    evaluating_.kind = actors::key_kind::evaluate;
    if (evaluation) evaluating_.payload = batched(device, input, actors::evaluation_batch);
    // An untimed round first: the first calls allocate the block's buffers and gradients.
    message_.kind = actors::key_kind::forward;
    actors::key_message gradient = message_;
    gradient.payload = stage_->forward(message_, true);
    gradient.kind = actors::key_kind::backward;
    stage_->backward(gradient, true);
    stage_->step(kTimedStepLearningRate);
  }

  void round() {
    const uint64_t round = ++rounds_;
    message_.key = round;
    message_.kind = actors::key_kind::forward;
    actors::key_message gradient = message_;
    forward_.push_back(timed(device_, [&] { gradient.payload = stage_->forward(message_, true); }));
    gradient.kind = actors::key_kind::backward;
    const bool input_gradient = round % 2 == 1;
    const double took = timed(device_, [&] { stage_->backward(gradient, input_gradient); });
    (input_gradient ? backward_ : first_).push_back(took);
    const auto version = static_cast<int64_t>(round);
    stash_.push_back(timed(device_, [&] { stage_->stash_weights(version); }));
    // The predicted copy replaces the plain one; the untimed first round made the momentum.
    if (predict_) {
      predicting_.push_back(
          timed(device_, [&] { stage_->stash_predicted_weights(version, predicted_distance); }));
    }
    stage_->release_weights_before(version);
    step_.push_back(timed(device_, [&] { stage_->step(kTimedStepLearningRate); }));
  }

  /// One evaluation forward (none without `evaluation`). Timed after a training round, each
  /// one found the caches full of the training keys' buffers: the CNN's evaluations took 23 %
  /// longer so than in a run, where they follow one another.
  void evaluation_round() {
    if (evaluating_.payload.empty()) return;
    evaluate_.push_back(timed(device_, [&] { stage_->forward(evaluating_, false); }));
  }
  /// Drops the evaluations timed so far (an untimed first one).
  void forget_evaluations() { evaluate_.clear(); }

  uint64_t rounds() const { return rounds_; }
  size_t evaluations() const { return evaluate_.size(); }

  /// The medians so far.
  block_profile profile() const {
    block_profile result;
    result.type = type_;
    result.forward_s = median(forward_);
    result.backward_s = median(backward_);
    result.backward_first_s = median(first_);
    result.step_s = median(step_);
    result.stash_s = median(stash_);
    result.predict_s = median(predicting_);
    result.evaluate_s = median(evaluate_);
    return result;
  }

 private:
  layers::backend& device_;
  const std::string type_;
  std::unique_ptr<actors::stage_device> stage_;
  actors::key_message message_;
  actors::key_message evaluating_;
  uint64_t rounds_ = 0;
  const bool predict_;
  std::vector<double> forward_, backward_, first_, step_, stash_, predicting_, evaluate_;
};

/// CPU seconds a stage at a boundary behind a block of output `sample` spends on the block's
/// messages per key: it sends one of the activation and its gradient and receives the other,
/// over inproc:// as the stages of one process do. 0 when the measurement fails.
double boundary_seconds(transport::transport_context& context, layers::backend& device,
                        const layers::shape& sample, int64_t batch, size_t index) {
  const std::string address =
      "inproc://troupe-partition-" + std::to_string(getpid()) + "-" + std::to_string(index);
  double latency = 0;
  const double end_s =
      taken_message_cpu_seconds(context, address, device, sample, batch, 30, &latency);
  return end_s > 0 ? 2 * end_s : 0.0;
}

}  // namespace

block_profile time_block(const actors::job_config& config, size_t index, layers::backend& device,
                         const layers::shape& input, int64_t batch, double seconds, int min_rounds,
                         bool evaluation) {
  block_timer timer(config, index, device, input, batch, evaluation);
  const auto start = clock_type::now();
  while (timer.rounds() < static_cast<uint64_t>(min_rounds) || seconds_since(start) < seconds) {
    timer.round();
  }
  if (evaluation) {
    timer.evaluation_round();
    timer.forget_evaluations();
    const auto evaluations = clock_type::now();
    while (timer.evaluations() < 3 || seconds_since(evaluations) < seconds / 4) {
      timer.evaluation_round();
    }
  }
  return timer.profile();
}

std::optional<std::vector<actors::block_cost>> measure_block_costs(const actors::job_config& config,
                                                                   double seconds,
                                                                   std::FILE* progress,
                                                                   std::string* error) {
  if (!config.model.nodes.empty()) return measure_node_costs(config, seconds, progress, error);
  auto shapes = layers::infer_shapes(config.model.layers, config.model.input_shape, error);
  if (!shapes) return std::nullopt;
  const int threads = actors::threads_per_stage(config);
  auto device = layers::create_backend(actors::device_of_stage(config, 0), threads, error);
  if (!device) return std::nullopt;
  const int64_t batch = config.training.batch_size / config.parallelism.micro_batches;
  const size_t blocks = shapes->size();
  const double total_s = seconds * static_cast<double>(blocks);
  if (progress && total_s > 1.0) {
    std::fprintf(progress, "troupe: timing %zu blocks on %s with %d thread(s) for %.1f s\n", blocks,
                 device->name().c_str(), threads, total_s);
  }
  std::vector<block_timer> timers;
  timers.reserve(blocks);
  for (size_t i = 0; i < blocks; ++i) {
    const layers::shape& input = i == 0 ? config.model.input_shape : (*shapes)[i - 1];
    timers.emplace_back(config, i, *device, input, batch, false);
  }
  // The blocks take turns, so that a slow spell of the machine slows all of them alike.
  const auto start = clock_type::now();
  while (timers.front().rounds() < 6 || seconds_since(start) < total_s) {
    for (block_timer& timer : timers) timer.round();
  }
  transport::transport_context context;
  if (blocks > 1) boundary_seconds(context, *device, (*shapes)[0], batch, blocks);  // warm-up
  const double steps_per_key = 1.0 / actors::keys_between_steps(config);
  std::vector<actors::block_cost> costs;
  for (size_t i = 0; i < blocks; ++i) {
    const block_profile timing = timers[i].profile();
    actors::block_cost cost;
    cost.forward = timing.forward_s;
    cost.backward = timing.backward_first_s;
    cost.input_gradient = std::max(0.0, timing.backward_s - timing.backward_first_s);
    cost.step = timing.step_s * steps_per_key;
    if (i + 1 < blocks) cost.message = boundary_seconds(context, *device, (*shapes)[i], batch, i);
    costs.push_back(cost);
  }
  return costs;
}

}  // namespace troupe::sim
