#include "actors/config/job_warnings.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "actors/config/job_checks.h"
#include "actors/config/job_file.h"
#include "layers/layer_registry.h"

namespace troupe::actors {
namespace {

/// A key and, when it does nothing in the job, why ("in sync mode: no key is stale").
struct idle_key {
  std::string key;
  bool idle;
  std::string why;
};

/// Whether a block of the model reads parallelism.recompute: transformer blocks do, and a
/// custom layer type may.
bool recomputes(const job_config& config) {
  return std::any_of(config.model.layers.begin(), config.model.layers.end(), [](const auto& spec) {
    return spec.type == "transformer_block" || layers::find_custom_layer_type(spec.type);
  });
}

std::vector<idle_key> parallelism_keys(const job_config& config) {
  const parallelism_config& p = config.parallelism;
  const bool sync = p.mode == pipeline_mode::sync;
  const std::string not_stale = "in sync mode: no key is stale";
  const std::string one_replica = "with one replica (parallelism.replicas = 1)";
  const std::string replicas_why =
      p.replicas == 1 ? one_replica
                      : "in sync mode: the replicas sum their gradients at every step";
  return {
      {"parallelism.min_update_interval", sync,
       "in sync mode: a stage steps once per batch, after its micro_batches backward passes"},
      {"parallelism.max_active_keys", sync, "in sync mode: the schedule sets the keys in flight"},
      {"parallelism.max_staleness", sync, not_stale},
      {"parallelism.weight_stashing", sync, not_stale},
      {"parallelism.staleness_correction", sync, not_stale},
      {"parallelism.correction_warmup_steps",
       sync || p.staleness_correction != staleness_correction_kind::pipemare,
       "without parallelism.staleness_correction = \"pipemare\" in async mode"},
      {"parallelism.schedule", !sync,
       "in async mode: keys are admitted up to parallelism.max_active_keys"},
      {"parallelism.virtual_stages", p.schedule != pipeline_schedule::interleaved,
       "outside parallelism.schedule = \"interleaved\""},
      {"parallelism.replica_sync_interval", sync || p.replicas == 1, replicas_why},
      {"parallelism.replica_staleness", sync || p.replicas == 1, replicas_why},
      {"parallelism.collective", p.replicas == 1, one_replica},
      {"parallelism.partition", p.stages == 1, "with one stage"},
      {"parallelism.recompute", !recomputes(config), "without transformer_block layers"},
  };
}

std::vector<idle_key> training_and_data_keys(const job_config& config) {
  const training_config& t = config.training;
  const dataset_kind dataset = config.data.dataset;
  const bool sgd = t.optimizer == layers::optimizer_kind::sgd;
  const bool step = t.lr_schedule == lr_schedule_kind::step;
  const bool text = dataset == dataset_kind::text, synthetic = dataset == dataset_kind::synthetic;
  const bool records = dataset == dataset_kind::text_records;
  const bool listops = dataset == dataset_kind::listops;
  const std::string adam =
      std::string("with training.optimizer = \"") + to_string(t.optimizer) + "\"";
  const std::string dataset_why = std::string("with data.dataset = \"") + to_string(dataset) + "\"";
  return {
      {"training.momentum", !sgd, adam + ": training.beta1 is its momentum"},
      {"training.beta1", sgd, "with training.optimizer = \"sgd\""},
      {"training.beta2", sgd, "with training.optimizer = \"sgd\""},
      {"training.epsilon", sgd, "with training.optimizer = \"sgd\""},
      {"training.lr_decay", !step, "without training.lr_schedule = \"step\""},
      {"training.lr_decay_epochs", !step, "without training.lr_schedule = \"step\""},
      {"data.context", !text && !records && !listops, dataset_why},
      {"data.validation_fraction", !text && !records, dataset_why},
      {"data.synthetic_train", !synthetic && !listops, dataset_why},
      {"data.synthetic_test", !synthetic && !listops, dataset_why},
      {"data.classes", !synthetic, dataset_why},
      {"data.path", synthetic || listops, dataset_why},
      {"data.max_depth", !listops, dataset_why},
      {"data.max_arguments", !listops, dataset_why},
      {"data.seed", !listops, dataset_why},
  };
}

/// Whether `key` ("section.name") holds the same value in both configurations as written; not
/// when either leaves the key out (a key written only where it does something).
bool same_value(const nlohmann::json& job, const nlohmann::json& defaults, const std::string& key) {
  const size_t dot = key.find('.');
  const std::string section = key.substr(0, dot), name = key.substr(dot + 1);
  const nlohmann::json &ours = job.at(section), &theirs = defaults.at(section);
  return ours.contains(name) && theirs.contains(name) && ours.at(name) == theirs.at(name);
}

/// A sync pipeline of one micro-batch: its only key visits the stages one after another.
std::optional<std::string> one_micro_batch(const job_config& config,
                                           const std::set<std::string>& set_keys) {
  const parallelism_config& p = config.parallelism;
  if (p.mode != pipeline_mode::sync || p.stages == 1 || p.micro_batches != 1 ||
      set_keys.count("parallelism.micro_batches") == 0) {
    return std::nullopt;
  }
  const std::string stages = std::to_string(p.stages);
  return "parallelism.micro_batches = 1 runs the " + stages +
         " stages one at a time in sync mode: each batch is one key, which visits them in turn "
         "(unset, micro_batches would be " +
         std::to_string(default_micro_batches(config)) + ")";
}

}  // namespace

std::vector<std::string> job_warnings(const job_config& config,
                                      const std::set<std::string>& set_keys) {
  std::vector<std::string> warnings;
  if (std::optional<std::string> warning = one_micro_batch(config, set_keys)) {
    warnings.push_back(*warning);
  }
  std::vector<idle_key> keys = parallelism_keys(config);
  for (idle_key& key : training_and_data_keys(config)) keys.push_back(std::move(key));
  const nlohmann::json job = to_json(config), defaults = to_json(job_config());
  for (const idle_key& key : keys) {
    if (!key.idle || set_keys.count(key.key) == 0 || same_value(job, defaults, key.key)) continue;
    warnings.push_back(key.key + " does nothing " + key.why);
  }
  return warnings;
}

std::optional<std::string> recovery_warning(const job_config& config) {
  const checkpoint_config& c = config.checkpoint;
  if (c.max_restarts == 0 || c.interval_steps > 0 || c.interval_s > 0) return std::nullopt;
  return "checkpoint.max_restarts = " + std::to_string(c.max_restarts) +
         " recovers from a lost worker, but without checkpoint.interval_steps or "
         "checkpoint.interval_s every recovery trains from step 0 again";
}

}  // namespace troupe::actors
