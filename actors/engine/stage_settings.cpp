#include "actors/engine/stage_settings.h"

#include <algorithm>
#include <thread>

#include "actors/engine/learning_rate.h"
#include "actors/engine/training_run.h"

namespace troupe::actors {

stage_settings stage_settings_of(const job_config& config, int index, int64_t steps_per_epoch,
                                 int64_t total_steps,
                                 const std::vector<std::shared_ptr<pass_turn>>& turns,
                                 int replica) {
  const parallelism_config& p = config.parallelism;
  stage_settings settings;
  settings.index = index;
  settings.count = p.stages;
  // Sync mode steps once per batch: after the backward passes of all its micro-batches.
  settings.min_update_interval =
      p.mode == pipeline_mode::sync
          ? p.micro_batches
          : (p.min_update_interval > 0 ? p.min_update_interval : p.micro_batches);
  const bool async = p.mode == pipeline_mode::async;
  settings.weight_stashing =
      p.weight_stashing || (async && p.staleness_correction == staleness_correction_kind::two_bw);
  settings.predict_weights = async && p.staleness_correction == staleness_correction_kind::predict;
  if (nesterov_correction(config)) {
    settings.nesterov_momentum = config.training.optimizer == layers::optimizer_kind::sgd
                                     ? config.training.momentum
                                     : config.training.beta1;
  }
  if (async && p.staleness_correction == staleness_correction_kind::pipemare) {
    settings.pipemare_warmup_steps = p.correction_warmup_steps > 0
                                         ? p.correction_warmup_steps
                                         : std::max<int64_t>(1, steps_per_epoch);
  }
  // The replicas' gradients are summed, so each scales by the whole batch.
  settings.replicas = p.replicas;
  settings.replica = replica;
  if (async && p.replicas > 1)
    settings.replica_sync_interval = std::max<int64_t>(1, p.replica_sync_interval);
  settings.gradient_scale = 1.0f / static_cast<float>(micro_batch_size(config) *
                                                      settings.min_update_interval * p.replicas);
  settings.key_gradient_scale =
      1.0f / static_cast<float>(settings.min_update_interval * p.replicas);
  settings.clip_norm = config.training.clip_norm;
  settings.global_clipping =
      p.mode == pipeline_mode::sync && p.stages > 1 && config.training.clip_norm > 0;
  settings.step_after_sending = p.mode == pipeline_mode::sync;
  if (!turns.empty()) settings.turn = turns[static_cast<size_t>(pipeline_worker_of(config, index))];
  // 1F1B's bound on forwards ahead of backwards; a fixed order of passes bounds them itself.
  if (backward_first(config) && p.schedule != pipeline_schedule::interleaved && !settings.turn) {
    settings.max_forward_keys = p.stages - index;
  }
  const training_config training = config.training;
  settings.learning_rate = [training, steps_per_epoch, total_steps](int64_t version) {
    return learning_rate_at(training, version, steps_per_epoch, total_steps);
  };
  return settings;
}

bool nesterov_correction(const job_config& config) {
  return config.parallelism.mode == pipeline_mode::async &&
         config.parallelism.staleness_correction == staleness_correction_kind::nesterov;
}

int keys_per_step(const job_config& config) {
  return config.parallelism.replicas * config.parallelism.micro_batches;
}

int64_t micro_batch_size(const job_config& config) {
  return config.training.batch_size / keys_per_step(config);
}

int entry_actor_of_key(const job_config& config, uint64_t key) {
  if (key >= first_evaluation_key) return 0;
  const int replica = static_cast<int>((key % static_cast<uint64_t>(keys_per_step(config))) /
                                       static_cast<uint64_t>(config.parallelism.micro_batches));
  return replica * config.parallelism.stages;
}

int stage_actor_count(const job_config& config) {
  return config.parallelism.replicas * config.parallelism.stages;
}

int job_threads(const job_config& config) {
  return config.parallelism.threads > 0
             ? config.parallelism.threads
             : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int pipeline_workers(const job_config& config) {
  const parallelism_config& p = config.parallelism;
  return p.schedule == pipeline_schedule::interleaved ? p.stages / p.virtual_stages : p.stages;
}

bool backward_first(const job_config& config) {
  return config.parallelism.mode == pipeline_mode::sync &&
         config.parallelism.schedule != pipeline_schedule::gpipe;
}

int threads_per_stage(const job_config& config) {
  return std::max(1, job_threads(config) /
                         (pipeline_workers(config) * std::max(1, config.parallelism.replicas)));
}

const std::string& device_of_stage(const job_config& config, int stage) {
  const auto& devices = config.parallelism.devices;
  return devices.size() == 1 ? devices.front() : devices[stage];
}

const std::string& device_of_actor(const job_config& config, int actor) {
  const auto& devices = config.parallelism.devices;
  const size_t stages = static_cast<size_t>(config.parallelism.stages);
  if (config.parallelism.replicas > 1 && devices.size() == stages * config.parallelism.replicas) {
    return devices[actor];
  }
  return device_of_stage(config, stage_of_actor(config, actor));
}

}  // namespace troupe::actors
