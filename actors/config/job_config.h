#pragma once

// The resolved configuration of a job: what a TOML job file plus its --set overrides say,
// with every default filled in. The field names are the job-file keys (`training.lr` is
// training.lr here); `troupe keys` and docs/guide/job-file.md describe each one.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "actors/config/model_graph.h"
#include "layers/backend.h"
#include "layers/layer_spec.h"
#include "layers/optimizer_kind.h"

namespace troupe::actors {

// The keys whose values are a closed set, read once from their names by the job schema -------

/// data.dataset: "fashion-mnist", "synthetic", "text", "text-records" or "listops".
enum class dataset_kind { fashion_mnist, synthetic, text, text_records, listops };
/// data.padding: "none" or "longest".
enum class padding_kind { none, longest };
/// parallelism.mode: "sync" or "async".
enum class pipeline_mode { sync, async };
/// parallelism.schedule: "gpipe", "1f1b", "zb-h1" or "interleaved".
enum class pipeline_schedule { gpipe, one_f_one_b, zb_h1, interleaved };
/// parallelism.staleness_correction: "none", "pipemare", "2bw", "predict" or "nesterov".
enum class staleness_correction_kind { none, pipemare, two_bw, predict, nesterov };
/// parallelism.collective: "ring", "nccl" or "shared_memory".
enum class collective_kind { ring, nccl, shared_memory };
/// training.lr_schedule: "constant", "cosine" or "step".
enum class lr_schedule_kind { constant, cosine, step };
// training.optimizer is a layers::optimizer_kind, training.precision a layers::math_precision;
// model.nodes[].route and emit are node_route and node_emit (model_graph.h).

/// One value of a closed set and the name a job file gives it.
template <typename E>
struct named_choice {
  E value;
  const char* name;
};

/// Every value of E by its job-file name, in the order messages list them (defined for the
/// enums above, layers::optimizer_kind and layers::math_precision).
template <typename E>
const std::vector<named_choice<E>>& choice_names();
template <>
const std::vector<named_choice<dataset_kind>>& choice_names();
template <>
const std::vector<named_choice<padding_kind>>& choice_names();
template <>
const std::vector<named_choice<pipeline_mode>>& choice_names();
template <>
const std::vector<named_choice<pipeline_schedule>>& choice_names();
template <>
const std::vector<named_choice<staleness_correction_kind>>& choice_names();
template <>
const std::vector<named_choice<collective_kind>>& choice_names();
template <>
const std::vector<named_choice<lr_schedule_kind>>& choice_names();
template <>
const std::vector<named_choice<node_route>>& choice_names();
template <>
const std::vector<named_choice<node_emit>>& choice_names();
template <>
const std::vector<named_choice<layers::optimizer_kind>>& choice_names();
template <>
const std::vector<named_choice<layers::math_precision>>& choice_names();

/// The name a job file gives the value ("fashion-mnist", "1f1b", "2bw", ...), for messages.
const char* to_string(dataset_kind value);
const char* to_string(padding_kind value);
const char* to_string(pipeline_mode value);
const char* to_string(pipeline_schedule value);
const char* to_string(staleness_correction_kind value);
const char* to_string(collective_kind value);
const char* to_string(lr_schedule_kind value);
const char* to_string(node_route value);
const char* to_string(node_emit value);

/// JSON writes each by its job-file name, as config.json does.
void to_json(nlohmann::json& json, dataset_kind value);
void to_json(nlohmann::json& json, padding_kind value);
void to_json(nlohmann::json& json, pipeline_mode value);
void to_json(nlohmann::json& json, pipeline_schedule value);
void to_json(nlohmann::json& json, staleness_correction_kind value);
void to_json(nlohmann::json& json, collective_kind value);
void to_json(nlohmann::json& json, lr_schedule_kind value);
void to_json(nlohmann::json& json, node_route value);
void to_json(nlohmann::json& json, node_emit value);

// The sections ------------------------------------------------------------------------------------

struct model_config {
  std::vector<layers::layer_spec> layers;
  /// A graph of nodes instead of `layers` (dynamic models, model_graph.h); empty for a chain.
  std::vector<graph_node_spec> nodes;
  std::vector<int64_t> input_shape{1, 28, 28};
  std::string loss = "softmax_cross_entropy";
  std::string init_from;  ///< a .safetensors file with the initial weights (empty: from the seed)
};

struct data_config {
  /// IDX files, seeded class prototypes, or UTF-8 files as byte tokens
  dataset_kind dataset = dataset_kind::fashion_mnist;
  std::string path = "/usr/share/datasets/fashion-mnist";  ///< text: fortunes when unset
  bool shuffle = true;
  bool normalize = true;           ///< standardize features with the training set's mean/std
  int64_t train_samples = 0;       ///< use only the first N training samples (0: all)
  int64_t test_samples = 0;        ///< use only the first N test samples (0: all)
  int64_t synthetic_train = 8192;  ///< synthetic data set sizes
  int64_t synthetic_test = 1024;
  int classes = 10;                   ///< synthetic data set classes
  int64_t context = 128;              ///< text: tokens per sequence
  double validation_fraction = 0.05;  ///< text: share of the text held out for evaluation
  /// text-records and listops: instances of their own sizes (layers/instance.h). text-records:
  /// one instance per record (the text between lines holding only "%", fortune's format), cut
  /// into pieces of at most `context` tokens. listops: nested MAX/MIN/MED/SM lists generated
  /// from `seed`, synthetic_train and synthetic_test of them, at most `context` tokens each.
  int max_depth = 4;      ///< listops: most nested lists
  int max_arguments = 5;  ///< listops: most arguments of one list
  uint64_t seed = 1;      ///< listops: the generator's seed
  /// Dynamic sequence models: "longest" pads each key's instances to the key's longest (the
  /// padded batch a framework without per-instance routes runs); "none" runs each at its length.
  padding_kind padding = padding_kind::none;
};

struct parallelism_config {
  int stages = 1;
  /// "balanced", "measured", "uniform" or cut points "3,7" (see actors/engine/partition.h)
  std::string partition = "balanced";
  std::vector<std::string> devices{"cpu"};
  pipeline_mode mode = pipeline_mode::sync;
  /// Sync mode: GPipe, 1F1B, ZB-H1 (1F1B with weight gradients deferred into the bubbles) or
  /// interleaved (1F1B over stages / virtual_stages workers, each hosting virtual_stages
  /// non-adjacent stages: worker w runs stages w, w + workers, ...).
  pipeline_schedule schedule = pipeline_schedule::gpipe;
  int virtual_stages = 1;
  /// Keys per batch. Unset in a sync pipeline: one per stage, or the nearest divisor of the
  /// batch of each replica (default_micro_batches() in actors/config/job_checks.h); else 1.
  int micro_batches = 1;
  int max_active_keys = 0;      ///< 0: the number of stages
  int min_update_interval = 0;  ///< 0: micro_batches
  int max_staleness = -1;       ///< -1: unbounded
  bool weight_stashing = false;
  /// Async mode's correction of stale gradients (sync mode has none to correct, and ignores
  /// it): none; pipemare (PipeMare's learning-rate rescheduling: each stage's step uses
  /// lr · τ^-(1 − min(k / K, 1)), τ the mean staleness of the keys the step applies, at least
  /// 1, k the stage's step and K correction_warmup_steps); two_bw (PipeDream-2BW: weight
  /// stashing and at most one newer weight version per backward, max_staleness = 1);
  /// predict (SpecTrain's weight prediction); nesterov (the delay-corrected Nesterov method:
  /// stage_settings::nesterov_momentum).
  staleness_correction_kind staleness_correction = staleness_correction_kind::none;
  /// PipeMare's K: steps over which the rescheduling fades out (0: one epoch's steps).
  int64_t correction_warmup_steps = 0;
  bool recompute = false;  ///< transformer blocks recompute activations in the backward pass
  int threads = 0;         ///< CPU threads shared among the stages (0: every core)
  /// How long a stage whose thread has a core of its own polls for its next message before
  /// the thread sleeps, while the machine has a core to spare (0: it sleeps at once; -1: 10 ms
  /// in sync mode, 0 in async mode).
  double spin_wait_ms = -1;
  /// Data parallelism: copies of the whole pipeline, each taking batch_size / replicas samples
  /// of every step. Sync mode sums each stage's gradients over its replicas before the step.
  int replicas = 1;
  /// Async mode with replicas: each stage averages its weights with its replicas every this
  /// many of its steps.
  int64_t replica_sync_interval = 1;
  /// Async mode with replicas: most weight versions a stage may run ahead of the slowest of
  /// its replicas (stale synchronous parallel; -1: unbounded).
  int replica_staleness = -1;
  /// How the same stage of the replicas sums: ring (a ring all-reduce over troupe's own
  /// ZeroMQ data path: any devices, CURVE between hosts), nccl (NCCL on the stages' GPUs, one
  /// GPU per replica of a stage), shared_memory (CPU replicas in one process).
  collective_kind collective = collective_kind::ring;
};

struct training_config {
  int64_t batch_size = 64;
  int64_t epochs = 1;
  int64_t max_steps = 0;  ///< 0: no limit
  layers::optimizer_kind optimizer = layers::optimizer_kind::sgd;
  double lr = 0.01;
  double momentum = 0.0;
  bool nesterov = false;  ///< SGD: Nesterov's look-ahead (PyTorch's nesterov=True)
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double clip_norm = 0.0;  ///< clip each stage's gradient to this L2 norm (0: off)
  lr_schedule_kind lr_schedule = lr_schedule_kind::constant;
  double lr_decay = 0.1;  ///< step: factor applied every lr_decay_epochs
  int64_t lr_decay_epochs = 0;
  int64_t warmup_steps = 0;
  uint64_t seed = 1;
  double target_accuracy = 0.0;  ///< 0: unset
  /// Also evaluate every this many steps within an epoch (0: after each epoch only), so that
  /// the time to target_accuracy is known to finer than an epoch.
  int64_t eval_interval_steps = 0;
  layers::math_precision precision = layers::math_precision::fp32;  ///< of the GEMMs
};

struct checkpoint_config {
  std::string dir;  ///< empty: OUT/checkpoints
  int64_t interval_steps = 0;
  double interval_s = 0.0;
  int keep_last = 3;
  int max_restarts = 3;             ///< worker losses recovered from before the run gives up
  double rejoin_timeout_s = 120.0;  ///< how long a lost rank may take to come back
};

struct metrics_config {
  int64_t log_interval = 100;
  bool trace = false;
  bool progress = true;  ///< progress bar when stderr is a terminal
  /// Keys in flight and no report for this long: the coordinator reports a stall (0: never).
  double stall_timeout_s = 30;
};

struct job_config {
  model_config model;
  data_config data;
  parallelism_config parallelism;
  training_config training;
  checkpoint_config checkpoint;
  metrics_config metrics;
};

}  // namespace troupe::actors
