#include "sim/calibration/calibrate.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "actors/config/job_data.h"
#include "actors/engine/partition.h"
#include "actors/engine/ring_all_reduce.h"
#include "actors/engine/stage_device.h"
#include "actors/engine/stage_settings.h"
#include "actors/engine/training_run.h"
#include "actors/hosts/actor_hosting.h"
#include "layers/backend_registry.h"
#include "layers/model.h"
#include "sim/calibration/block_timing.h"
#include "sim/calibration/graph_calibration.h"
#include "sim/calibration/measuring.h"
#include "sim/calibration/process_pipeline.h"
#include "sim/calibration/stage_fitting.h"
#include "sim/calibration/stage_rounds.h"
#include "sim/calibration/this_machine.h"
#include "sim/calibration/transport_timing.h"

namespace troupe::sim {
namespace {

/// A stage's throughput is its mean time per key, slow outliers included.
double mean(const std::vector<double>& values) {
  double sum = 0;
  for (double value : values) sum += value;
  return values.empty() ? 0 : sum / static_cast<double>(values.size());
}

/// Times the stage of blocks `range` as a pipeline stage runs it, one training round at a time:
/// keys_per_round() keys forward, the same keys back, a weight stash (asynchronous training with
/// stashing, or a predicted copy with staleness_correction = "predict") and the step. Its weights,
/// gradients, optimizer state and the keys' activations then compete for the caches as in training:
/// a block timed alone keeps its state cached, and this model's step ran 4 times faster alone than
/// in a stage. Stages that share a core take turns key by key (forward_key(), backward_key(),
/// finish_round()), as they interleave in a run, so a stage's weights seldom stay cached from one
/// of its keys to the next; a stage with a core of its own runs its keys back to back.
class stage_timer {
 public:
  stage_timer(const actors::job_config& config, actors::stage_range range, bool first, bool last,
              layers::backend& device, const layers::shape& input, const layers::shape& output,
              int64_t batch)
      : device_(device),
        stage_(actors::make_layers_stage_device(config, range, device)),
        inputs_(batched(device, input, batch)),
        gradients_(batched(device, output, batch)),
        first_(first),
        last_(last),
        keys_per_round_(keys_in_round(config)),
        stash_(config.parallelism.mode == actors::pipeline_mode::async &&
               engine_settings(config).weight_stashing),
        // The last stage's keys are never stale: it predicts nothing.
        predict_(engine_settings(config).predict_weights && !last),
        replicated_(config.parallelism.replicas > 1) {}

  int keys_per_round() const { return keys_per_round_; }
  /// Whether the stage is the last, which runs each key's backward pass right after its forward.
  bool last() const { return last_; }
  /// The forward pass of the round's key `i`. With predicted weights, the round's first key
  /// makes the round's copy first, and every pass of the round runs on it, as in the engine.
  void forward_key(int i) {
    actors::key_message message;
    message.key = key_ + static_cast<uint64_t>(i);
    message.kind = actors::key_kind::forward;
    message.payload = inputs_;
    if (predict_) {
      const auto version = static_cast<int64_t>(key_);
      if (i == 0) {
        predicting_.push_back(
            timed(device_, [&] { stage_->stash_predicted_weights(version, predicted_distance); }));
      }
      stage_->use_weights(version);
    }
    forward_.push_back(timed(device_, [&] { stage_->forward(message, true); }));
  }
  /// The backward pass of the round's key `i`.
  void backward_key(int i) {
    actors::key_message message;
    message.key = key_ + static_cast<uint64_t>(i);
    message.kind = actors::key_kind::backward;
    message.payload = gradients_;
    if (predict_) stage_->use_weights(static_cast<int64_t>(key_));
    backward_.push_back(timed(device_, [&] { stage_->backward(message, !first_); }));
  }
  /// The stash and the step that end a round (and release the round's predicted copy), and a
  /// replicated stage's gradient round trip before the step.
  void finish_round() {
    key_ += static_cast<uint64_t>(keys_per_round_);
    const auto version = static_cast<int64_t>(key_);
    if (stash_) stashing_.push_back(timed(device_, [&] { stage_->stash_weights(version); }));
    if (replicated_) time_gradient_round_trip();
    stage_->release_weights_before(version);
    step_.push_back(timed(device_, [&] { stage_->step(kTimedStepLearningRate); }));
  }
  /// Drops what was timed so far (an untimed first round: first-touch page faults, cold caches).
  void forget() {
    forward_.clear();
    backward_.clear();
    step_.clear();
    stashing_.clear();
    predicting_.clear();
    copies_.clear();
  }

  size_t rounds() const { return step_.size(); }
  stage_timing timing() const {
    return {mean(forward_),
            mean(backward_),
            mean(step_),
            mean(stashing_),
            mean(predicting_),
            {},
            log_spread({&forward_, &backward_}),
            median(copies_),
            static_cast<int64_t>(values_.size())};
  }

 private:
  layers::backend& device_;
  std::unique_ptr<actors::stage_device> stage_;
  const layers::tensor inputs_;
  const layers::tensor gradients_;
  const bool first_;
  const bool last_;
  const int keys_per_round_;
  const bool stash_;
  const bool predict_;
  const bool replicated_;
  uint64_t key_ = 0;
  std::vector<double> forward_, backward_, step_, stashing_, predicting_, copies_;
  std::vector<float> values_;

  /// A replica's stage copies its gradients out for the all-reduce, sums into them and copies
  /// them back, between its backward passes and its step, with the stage's (and its
  /// neighbours') weights, gradients and activations competing for the caches as in a run:
  /// timed alone on a warm buffer the same copies ran 3 to 6 times faster than in a run.
  void time_gradient_round_trip() {
    const double seconds = timed(device_, [&] {
      stage_->read_gradient_values(&values_);
      for (float& value : values_) value += value;
      stage_->set_gradient_values(values_);
    });
    copies_.push_back(seconds / (2.0 * static_cast<double>(std::max<size_t>(1, values_.size()))));
  }
};

/// Times every stage of `ranges` with a stage_timer, each core group on its own backend and
/// thread, the groups at once: `groups` stages compute at a time, as in a real run where they
/// share the memory bandwidth and the last-level cache. The stages join the groups so that
/// their `costs` (a round's, timed alone) come out even, as a run's scheduler keeps the cores
/// evenly busy, and a group runs its stages' rounds in turn, so that every stage's state is in
/// use between two rounds of one, as in training. The groups keep pace round by round
/// (round_barrier): a light group idles while a heavy one finishes its round, as a light
/// stage does in a pipeline. They go on until every group has run `seconds` per block of its
/// stages, and every stage at least three rounds.
std::optional<std::vector<stage_timing>> time_stages(
    const actors::job_config& config, const std::vector<actors::stage_range>& ranges,
    const std::vector<double>& costs, const std::vector<layers::shape>& shapes, int64_t batch,
    double seconds, int groups, const std::string& backend_name, int threads, std::string* error) {
  const size_t stages = ranges.size();
  const std::vector<int> group_of = balanced_groups(costs, groups);
  round_barrier barrier(groups);
  std::vector<std::unique_ptr<layers::backend>> backends;
  for (int g = 0; g < groups; ++g) {
    backends.push_back(layers::create_backend(backend_name, threads, error));
    if (!backends.back()) return std::nullopt;
  }
  std::vector<stage_timing> timings(stages);
  auto time_group = [&](int group) {
    std::vector<size_t> members;
    std::vector<stage_timer> timers;
    double group_seconds = 0;
    for (size_t s = 0; s < stages; ++s) {
      if (group_of[s] != group) continue;
      const actors::stage_range range = ranges[s];
      const layers::shape& input =
          range.first == 0 ? config.model.input_shape : shapes[range.first - 1];
      members.push_back(s);
      timers.emplace_back(config, range, range.first == 0, range.last == config.model.layers.size(),
                          *backends[group], input, shapes[range.last - 1], batch);
      group_seconds += seconds * static_cast<double>(range.last - range.first);
    }
    const auto round = [&] { run_stage_round(timers); };
    round();
    for (stage_timer& timer : timers) timer.forget();
    barrier.arrive_and_wait(false);
    const auto start = clock_type::now();
    do {
      round();
    } while (!barrier.arrive_and_wait(timers.front().rounds() >= 3 &&
                                      seconds_since(start) >= group_seconds));
    for (size_t i = 0; i < members.size(); ++i) timings[members[i]] = timers[i].timing();
  };
  std::vector<std::thread> workers;
  for (int g = 1; g < groups; ++g) workers.emplace_back(time_group, g);
  time_group(0);
  for (std::thread& worker : workers) worker.join();
  return timings;
}

/// Every block's costs: measured alone, then scaled per stage of the job's partition to what
/// the whole stage costs in training order, next to the stages that compute at the same time.
std::optional<std::vector<block_profile>> time_blocks(const actors::job_config& config,
                                                      layers::backend& device,
                                                      const std::vector<layers::shape>& shapes,
                                                      int64_t batch, double seconds,
                                                      std::vector<stage_timing>* stage_timings,
                                                      std::string* error) {
  auto ranges = actors::partition_model(config, error);
  if (!ranges) return std::nullopt;
  std::vector<block_profile> blocks;
  for (size_t i = 0; i < config.model.layers.size(); ++i) {
    const layers::shape& input = i == 0 ? config.model.input_shape : shapes[i - 1];
    blocks.push_back(time_block(config, i, device, input, batch, seconds, 3, true));
  }
  const int threads = actors::threads_per_stage(config);
  // Every replica's stages, as the run has them: as many compute at once as the job's threads
  // allow (this machine's cores by default).
  const int replicas = config.parallelism.replicas;
  std::vector<actors::stage_range> actor_ranges;
  for (int r = 0; r < replicas; ++r) {
    actor_ranges.insert(actor_ranges.end(), ranges->begin(), ranges->end());
  }
  const int groups =
      std::clamp(actors::job_threads(config) / threads, 1, static_cast<int>(actor_ranges.size()));
  // A round of each stage: its keys' passes and its step, by the blocks' times alone.
  std::vector<double> costs;
  const double keys = keys_in_round(config);
  for (const actors::stage_range& range : actor_ranges) {
    double cost = 0;
    for (size_t b = range.first; b < range.last; ++b) {
      cost += keys * (blocks[b].forward_s + blocks[b].backward_s) + blocks[b].step_s;
    }
    costs.push_back(cost);
  }
  auto timings = time_stages(config, actor_ranges, costs, shapes, batch, seconds, groups,
                             actors::device_of_stage(config, 0), threads, error);
  if (!timings) return std::nullopt;
  // A stage's cost: the mean of its replicas', which computed beside each other.
  const size_t stages = ranges->size();
  for (size_t s = 0; s < stages && replicas > 1; ++s) {
    stage_timing& mean = (*timings)[s];
    for (int r = 1; r < replicas; ++r) {
      const stage_timing& other = (*timings)[r * stages + s];
      mean.forward_s += other.forward_s;
      mean.backward_s += other.backward_s;
      mean.step_s += other.step_s;
      mean.stash_s += other.stash_s;
      mean.predict_s += other.predict_s;
      mean.copy_s_per_float += other.copy_s_per_float;
    }
    mean.forward_s /= replicas;
    mean.backward_s /= replicas;
    mean.step_s /= replicas;
    mean.stash_s /= replicas;
    mean.predict_s /= replicas;
    mean.copy_s_per_float /= replicas;
  }
  timings->resize(stages);
  for (size_t s = 0; s < stages; ++s) (*timings)[s].range = (*ranges)[s];
  fit_blocks_to_stages(config, *timings, &blocks);
  *stage_timings = std::move(*timings);
  return blocks;
}

/// Sets profile->time_slice_efficiency when the job has more stages than this machine has
/// cores: a stand-in pipeline of the job's stage times, one process per stage, keeps the job's
/// keys in flight (flushing them every step in sync mode) and measures its keys per second;
/// the efficiency is the share at which the simulator runs the job that fast (see
/// fit_time_slice_efficiency). 1 otherwise.
bool time_slicing(const actors::job_config& config, const std::vector<layers::shape>& shapes,
                  const std::vector<stage_timing>& timings, double seconds,
                  machine_profile* profile, std::string* error) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  if (timings.size() <= cores) return true;
  const double steps_per_key = 1.0 / keys_in_round(config);
  const auto bytes = [&](const layers::shape& sample) {
    return static_cast<size_t>(profile->batch * layers::element_count(sample)) * sizeof(float);
  };
  std::vector<pipeline_stage_cost> stages;
  for (size_t s = 0; s < timings.size(); ++s) {
    const stage_timing& t = timings[s];
    const bool last = s + 1 == timings.size();
    pipeline_stage_cost stage;
    const double backward_s = t.backward_s + (t.step_s + t.stash_s + t.predict_s) * steps_per_key;
    stage.forward_s = last ? t.forward_s + backward_s + profile->loss_s : t.forward_s;
    stage.backward_s = last ? 0 : backward_s;
    stage.output_bytes = bytes(shapes[t.range.last - 1]);
    stages.push_back(stage);
  }
  // Keys in flight (load_job_file() resolves max_active_keys = 0 to the stage count).
  const bool sync = config.parallelism.mode == actors::pipeline_mode::sync;
  const int keys =
      std::max(1, sync ? config.parallelism.micro_batches : config.parallelism.max_active_keys);
  auto measured = process_pipeline_keys_per_s(
      stages, bytes(config.model.input_shape), profile->batch, keys, sync,
      actors::spin_wait_seconds(config.parallelism), std::max(0.5, 4 * seconds), error);
  if (!measured) return false;
  auto efficiency = fit_time_slice_efficiency(config, *profile, *measured, error);
  if (!efficiency) return false;
  profile->time_slice_efficiency = *efficiency;
  return true;
}

}  // namespace

std::optional<machine_profile> calibrate(const actors::job_config& config, double seconds,
                                         std::string* error) {
  if (!config.model.nodes.empty()) return calibrate_graph(config, seconds, error);
  auto shapes = layers::infer_shapes(config.model.layers, config.model.input_shape, error);
  if (!shapes) return std::nullopt;
  machine_profile profile;
  profile.backend = actors::device_of_stage(config, 0);
  profile.threads = actors::threads_per_stage(config);
  profile.batch = actors::micro_batch_size(config);  // every replica's keys are this size
  profile.evaluation_batch = actors::evaluation_batch;
  auto device = layers::create_backend(profile.backend, profile.threads, error);
  if (!device) return std::nullopt;
  std::vector<stage_timing> stages;
  auto blocks = time_blocks(config, *device, *shapes, profile.batch, seconds, &stages, error);
  if (!blocks) return std::nullopt;
  profile.blocks = std::move(*blocks);
  std::vector<double> spreads;
  for (const stage_timing& stage : stages) spreads.push_back(stage.work_jitter);
  profile.work_jitter = std::min(1.0, median(spreads));
  // The loss: logits of the key's size against labels.
  const int64_t classes = layers::element_count(shapes->back());
  std::vector<float> logits(static_cast<size_t>(profile.batch * classes), 0.1f);
  std::vector<int32_t> labels(static_cast<size_t>(profile.batch), 0);
  auto last = actors::make_layers_stage_device(
      config, {config.model.layers.size() - 1, config.model.layers.size()}, *device);
  const layers::tensor output = layers::tensor::from_host(*device, device->default_stream(),
                                                          {profile.batch, classes}, logits);
  std::vector<double> times;
  const auto start = clock_type::now();
  while (times.size() < 3 || seconds_since(start) < seconds) {
    const auto begin = clock_type::now();
    last->loss(output, labels, 1.0f, true);
    device->synchronize(device->default_stream());
    times.push_back(seconds_since(begin));
  }
  profile.loss_s = median(times);
  // A replicated stage's round trip of its gradients through host memory, as its stage timer
  // took it.
  std::vector<double> copies;
  for (const stage_timing& stage : stages) {
    if (stage.copy_s_per_float > 0) copies.push_back(stage.copy_s_per_float);
  }
  profile.parameter_copy_s_per_float = median(copies);
  layers::shape biggest = config.model.input_shape;
  for (const layers::shape& shape : *shapes) {
    if (layers::element_count(shape) > layers::element_count(biggest)) biggest = shape;
  }
  int64_t biggest_samples = profile.batch;
  // Replicas all-reduce their stages' gradients (or weights) in pieces, the job's biggest
  // messages by far: the cost per byte is measured at that size, not extrapolated from keys.
  const int64_t replicas = config.parallelism.replicas;
  for (const stage_timing& stage : stages) {
    const int64_t piece =
        std::min(actors::ring_piece_floats, (stage.replica_floats + replicas - 1) / replicas);
    if (piece > layers::element_count(biggest) * biggest_samples) {
      biggest = layers::shape{piece};
      biggest_samples = 1;
    }
  }
  if (!time_transport(&profile, *device, config.model.input_shape, biggest, biggest_samples,
                      error)) {
    return std::nullopt;
  }
  // The coordinator's share of every key: its batch gathered from the job's own training set.
  auto data = actors::load_job_data(config, error);
  if (!data) return std::nullopt;
  auto host = layers::create_backend("cpu", 1, error);
  if (!host) return std::nullopt;
  profile.coordinator_s_per_sample =
      coordinator_seconds_per_sample(data->train, profile.batch, *host, seconds);
  if (!time_slicing(config, *shapes, stages, seconds, &profile, error)) return std::nullopt;
  return profile;
}

}  // namespace troupe::sim
