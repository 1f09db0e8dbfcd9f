#include "actors/config/job_checks.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/layer_cuts.h"

namespace troupe::actors {
namespace {

/// Nothing, or one line saying what is wrong.
using problem = std::optional<std::string>;

/// Weight prediction moves the weights along SGD's momentum buffer, and the delay-corrected
/// Nesterov method raises SGD's momentum or Adam's β1; Nesterov's look-ahead needs one too.
problem check_staleness_correction(const job_config& config) {
  const training_config& t = config.training;
  const bool momentum_sgd = t.optimizer == layers::optimizer_kind::sgd && t.momentum > 0;
  const bool adam = t.optimizer != layers::optimizer_kind::sgd;
  if (t.nesterov && !momentum_sgd && !adam) {
    return std::string(
        "training.nesterov = true needs training.momentum > 0 with training.optimizer = "
        "\"sgd\" (or \"adam\" / \"adamw\": NAdam)");
  }
  const staleness_correction_kind correction = config.parallelism.staleness_correction;
  if (momentum_sgd || (correction == staleness_correction_kind::nesterov && adam)) {
    return std::nullopt;
  }
  if (correction == staleness_correction_kind::predict) {
    return std::string(
        "parallelism.staleness_correction = \"predict\" needs training.optimizer = \"sgd\" "
        "with training.momentum > 0: it predicts the weights along the momentum buffer");
  }
  if (correction == staleness_correction_kind::nesterov) {
    return std::string(
        "parallelism.staleness_correction = \"nesterov\" needs training.optimizer = \"sgd\" "
        "with training.momentum > 0, or \"adam\" / \"adamw\": it raises the momentum (β1) "
        "of delayed stages");
  }
  return std::nullopt;
}

/// The interleaved schedule puts parallelism.virtual_stages stages on each worker.
problem check_schedule(const job_config& config) {
  const parallelism_config& p = config.parallelism;
  const std::string v = std::to_string(p.virtual_stages);
  // Other schedules ignore virtual_stages, so that a sweep over schedules can keep it set.
  if (p.schedule != pipeline_schedule::interleaved) return std::nullopt;
  if (p.mode != pipeline_mode::sync) {
    return "parallelism.schedule = \"interleaved\" needs mode = \"sync\"";
  }
  if (p.stages % p.virtual_stages != 0) {
    return "parallelism.stages (" + std::to_string(p.stages) +
           ") must be a multiple of parallelism.virtual_stages (" + v +
           "): the interleaved schedule gives each of stages / virtual_stages workers " + v +
           " stages";
  }
  return std::nullopt;
}

/// A text or text-records job reads Debian's fortunes unless data.path says otherwise; a text
/// job feeds its model sequences of data.context token ids.
problem resolve_text_defaults(job_config* config) {
  data_config& data = config->data;
  const bool records = data.dataset == dataset_kind::text_records;
  if (data.dataset != dataset_kind::text && !records) return std::nullopt;
  if (data.path == data_config().path) data.path = "/usr/share/games/fortunes";
  if (records) return std::nullopt;
  std::vector<int64_t>& shape = config->model.input_shape;
  if (shape == model_config().input_shape) shape = {data.context};
  if (shape != std::vector<int64_t>{data.context}) {
    return "model.input_shape must be [data.context] = [" + std::to_string(data.context) +
           "] for text data, got " + nlohmann::json(shape).dump();
  }
  return std::nullopt;
}

/// parallelism.collective against the stages' devices.
problem check_collective(const parallelism_config& p) {
  for (const std::string& device : p.devices) {
    const bool cuda = device.rfind("cuda", 0) == 0;
    if (p.collective == collective_kind::nccl && !cuda) {
      return "parallelism.collective = \"nccl\" needs every stage on a CUDA device, but "
             "parallelism.devices has \"" +
             device + "\" (use \"ring\" for CPU stages)";
    }
    if (p.collective == collective_kind::shared_memory && cuda) {
      return "parallelism.collective = \"shared_memory\" sums CPU stages in one process, but "
             "parallelism.devices has \"" +
             device + "\" (use \"nccl\" or \"ring\")";
    }
  }
  return std::nullopt;
}

/// A model is a chain of blocks or a graph of nodes, and a graph runs on instances.
problem check_model_kind(const job_config& config) {
  const model_config& model = config.model;
  if (model.layers.empty() && model.nodes.empty()) {
    return std::string("missing required key 'model.layers' (or [[model.nodes]], a graph)");
  }
  if (model.nodes.empty()) return std::nullopt;
  if (!model.layers.empty()) {
    return std::string(
        "model.layers and model.nodes are both set: a model is a chain of blocks (model.layers) "
        "or a graph of nodes (model.nodes), not both");
  }
  const dataset_kind data = config.data.dataset;
  if (data != dataset_kind::text_records && data != dataset_kind::listops) {
    return std::string(
               "model.nodes needs data of instances of their own sizes, data.dataset = "
               "\"text-records\" or \"listops\", but data.dataset is \"") +
           to_string(data) + "\"";
  }
  std::vector<cut_point> cuts;
  if (parse_cut_points(config.parallelism.partition, &cuts)) {
    for (const cut_point& cut : cuts) {
      if (cut.row > 0) {
        return "parallelism.partition [" + config.parallelism.partition +
               "]: a graph (model.nodes) is cut between nodes, at node indices in the order rows "
               "visit them (as `troupe train` prints the stages), not inside a layer";
      }
    }
  }
  return std::nullopt;
}

/// The shortest ListOps expression, [MAX 1 2 ], is 4 tokens.
problem check_listops(const data_config& data) {
  if (data.dataset != dataset_kind::listops || data.context >= 4) return std::nullopt;
  return "data.context must be at least 4 for listops data (the shortest list, [MAX 1 2 ]), got " +
         std::to_string(data.context);
}

/// Padding lengthens sequences, the instances of text-records; trees and chains have none.
problem check_padding(const data_config& data) {
  if (data.padding == padding_kind::none || data.dataset == dataset_kind::text_records)
    return std::nullopt;
  return std::string("data.padding = \"") + to_string(data.padding) +
         "\" pads sequence instances (data.dataset = \"text-records\" with model.nodes), but "
         "data.dataset is \"" +
         to_string(data.dataset) + "\"";
}

/// What the stages split: the blocks of a chain, the nodes of a graph.
size_t stage_units(const model_config& model) {
  return model.nodes.empty() ? model.layers.size() : model.nodes.size();
}

}  // namespace

int default_micro_batches(const job_config& config) {
  const parallelism_config& p = config.parallelism;
  const int64_t batch = config.training.batch_size;
  // A job with more stages than blocks is refused below; the search stays within the blocks.
  if (p.mode != pipeline_mode::sync || p.stages <= 1 || batch % p.replicas != 0 ||
      static_cast<size_t>(p.stages) > stage_units(config.model)) {
    return 1;
  }
  const int64_t per_replica = batch / p.replicas;
  for (int64_t keys = p.stages; keys <= 2 * int64_t{p.stages}; ++keys) {
    if (per_replica % keys == 0) return static_cast<int>(keys);
  }
  int64_t keys = p.stages - 1;
  while (per_replica % keys != 0) --keys;
  return static_cast<int>(keys);
}

problem check_consistency(job_config* config, const std::set<std::string>& set_keys) {
  if (problem error = check_model_kind(*config)) return error;
  parallelism_config& p = config->parallelism;
  const training_config& t = config->training;
  if (set_keys.count("parallelism.micro_batches") == 0) {
    p.micro_batches = default_micro_batches(*config);
  }
  const std::string stages = std::to_string(p.stages);
  if (t.batch_size % p.micro_batches != 0) {
    return "parallelism.micro_batches (" + std::to_string(p.micro_batches) +
           ") must divide training.batch_size (" + std::to_string(t.batch_size) + ")";
  }
  if (t.batch_size % (int64_t(p.replicas) * p.micro_batches) != 0) {
    return "parallelism.replicas (" + std::to_string(p.replicas) +
           ") times parallelism.micro_batches (" + std::to_string(p.micro_batches) +
           ") must divide training.batch_size (" + std::to_string(t.batch_size) +
           "): each replica takes batch_size / replicas samples of every step";
  }
  if (static_cast<size_t>(p.stages) > stage_units(config->model)) {
    const bool graph = !config->model.nodes.empty();
    return "parallelism.stages (" + stages + ") exceeds the number of " +
           (graph ? "nodes in model.nodes (" : "layers in model.layers (") +
           std::to_string(stage_units(config->model)) + ")";
  }
  const size_t actors = static_cast<size_t>(p.stages) * static_cast<size_t>(p.replicas);
  if (p.devices.size() != 1 && p.devices.size() != static_cast<size_t>(p.stages) &&
      p.devices.size() != actors) {
    return "parallelism.devices names " + std::to_string(p.devices.size()) +
           " devices but parallelism.stages is " + stages +
           (p.replicas > 1 ? " and parallelism.replicas " + std::to_string(p.replicas) +
                                 " (give one, one per stage, or one per stage of every replica)"
                           : " (give one, or one per stage)");
  }
  if (problem error = check_collective(p)) return error;
  if (p.spin_wait_ms < 0 && p.spin_wait_ms != -1) {
    return "parallelism.spin_wait_ms must be -1 (10 ms in sync mode, 0 in async mode) or >= 0";
  }
  if (p.replica_staleness == 0) {
    return "parallelism.replica_staleness must be -1 (unbounded) or >= 1: at 0 no replica could "
           "admit a key while another has one in flight";
  }
  if (t.lr_schedule == lr_schedule_kind::step && t.lr_decay_epochs < 1) {
    return "training.lr_decay_epochs must be >= 1 when training.lr_schedule is 'step'";
  }
  if (problem error = check_schedule(*config)) return error;
  if (problem error = check_staleness_correction(*config)) return error;
  if (problem error = resolve_text_defaults(config)) return error;
  if (problem error = check_listops(config->data)) return error;
  if (problem error = check_padding(config->data)) return error;
  if (std::string error = expand_cut_points(config); !error.empty()) return error;
  if (p.max_active_keys == 0) p.max_active_keys = p.stages;
  if (p.min_update_interval == 0) p.min_update_interval = p.micro_batches;
  return std::nullopt;
}

}  // namespace troupe::actors
