#include "actors/config/job_schema.h"

#include <map>

#include "actors/config/job_values.h"
#include "actors/config/node_schema.h"
#include "layers/layer_registry.h"

namespace troupe::actors::detail {
namespace {

using layers::layer_spec;

// model.layers -----------------------------------------------------------------------------------

field bias_field(layer_spec& spec) {
  return bool_field("bias", &spec.bias).about("add a learned bias");
}

field vocab_field(layer_spec& spec) {
  return required(integer_field("vocab", &spec.vocab, 1))
      .about("vocabulary size: token ids run from 0 to vocab - 1");
}

/// The keys of a type registered by a program that embeds troupe (layers/layer_registry.h).
std::vector<field> custom_layer_fields(layer_spec& spec) {
  std::vector<field> fields;
  const layers::custom_layer_type* custom = layers::find_custom_layer_type(spec.type);
  if (custom == nullptr) return fields;
  if (custom->uses_out) {
    fields = {required(integer_field("out", &spec.out, 1)).about("output features"),
              bias_field(spec)};
  }
  for (const std::string& name : custom->options) {
    spec.options.emplace(name, 0.0);
    fields.push_back(number_field(name, &spec.options[name], kAnyNumber)
                         .about("a number the registered layer type reads"));
  }
  return fields;
}

std::vector<field> convolution_fields(layer_spec& spec) {
  return {required(integer_field("out", &spec.out, 1)).about("output channels"),
          required(integer_field("kernel", &spec.kernel, 1)).about("side of the square window"),
          integer_field("stride", &spec.stride, 1).about("step between windows"),
          integer_field("padding", &spec.padding, 0).about("zeros added on every side"),
          bias_field(spec)};
}

}  // namespace

problem read_layer(const toml::node& node, const std::string& where, layer_spec* spec) {
  const auto* table = node.as_table();
  if (table == nullptr) return wrong_type(where, "a table such as { type = \"relu\" }", node);
  const toml::node* type = table->get("type");
  if (type == nullptr) return where + ": missing required key 'type'";
  std::string name;
  if (problem error = read_string(*type, where + ".type", layers::layer_type_names(), &name))
    return error;
  *spec = layer_with_defaults(name);
  const std::vector<field> fields = layer_fields(*spec);
  naming names{where + " (" + spec->type + "): ", "", {}, nullptr};
  for (const auto& f : fields) names.suggestions.push_back(f.name);
  if (problem error = read_fields(*table, fields, names, {"type"})) return error;
  if (spec->type == "maxpool2d" && table->get("stride") == nullptr) spec->stride = spec->kernel;
  return std::nullopt;
}

nlohmann::json layers_json(const std::vector<layer_spec>& specs) {
  nlohmann::json json = nlohmann::json::array();
  for (layer_spec spec : specs) {
    nlohmann::json& layer = json.emplace_back(nlohmann::json{{"type", spec.type}});
    for (const auto& f : layer_fields(spec)) layer[f.name] = f.write();
  }
  return json;
}

namespace {

// The sections -----------------------------------------------------------------------------------

/// `first` followed by `second`.
std::vector<field> joined(std::vector<field> first, std::vector<field> second) {
  for (field& f : second) first.push_back(std::move(f));
  return first;
}

std::vector<field> model_fields(model_config& model) {
  auto read_layers = [&model](const toml::node& node, const std::string& label) {
    return read_array(node, label, "an array of layer tables", read_layer, &model.layers);
  };
  auto read_shape = [&model](const toml::node& node, const std::string& label) {
    return read_array(node, label, "an array of positive integers", read_positive,
                      &model.input_shape);
  };
  return {field{"layers", read_layers, [&model] { return layers_json(model.layers); }}
              .about("the model's blocks in order, each an inline table with a `type` (see the "
                     "layer blocks below)")
              .default_means("required unless the model is a graph, model.nodes")
              .written_only_if([&model] { return model.nodes.empty(); }),
          nodes_field(model),
          field{"input_shape", read_shape, write_value(&model.input_shape)}
              .about("shape of one sample")
              .default_means("text: [data.context]"),
          string_field("loss", &model.loss, {"softmax_cross_entropy"})
              .about("the loss after the last block"),
          string_field("init_from", &model.init_from)
              .about("a .safetensors file with the initial weights (`troupe export` writes one)")
              .default_means("initialized from training.seed")};
}

std::vector<field> data_fields(data_config& data) {
  return {
      choice_field("dataset", &data.dataset)
          .about("the samples: IDX image files (fashion-mnist), seeded class prototypes with noise "
                 "(synthetic), UTF-8 files read as byte tokens (text), one instance of its own "
                 "length per record of such files (text-records, for model.nodes), or seeded "
                 "ListOps expressions, each a tree (listops, for model.nodes)"),
      string_field("path", &data.path)
          .about("directory of the train-* and t10k-* IDX files (.gz or not); for text and "
                 "text-records a file or a directory")
          .default_means("text and text-records: /usr/share/games/fortunes"),
      bool_field("shuffle", &data.shuffle).about("reshuffle the training set every epoch, seeded"),
      bool_field("normalize", &data.normalize)
          .about("standardize features with the training set's mean and deviation"),
      integer_field("train_samples", &data.train_samples, 0)
          .about("use only the first N training samples")
          .default_means("all"),
      integer_field("test_samples", &data.test_samples, 0)
          .about("use only the first N test samples")
          .default_means("all"),
      integer_field("synthetic_train", &data.synthetic_train, 1)
          .about("synthetic and listops: training samples"),
      integer_field("synthetic_test", &data.synthetic_test, 1)
          .about("synthetic and listops: test samples"),
      integer_field("classes", &data.classes, 2).about("synthetic: classes"),
      integer_field("context", &data.context, 1)
          .about("text: tokens per training sequence; text-records: most tokens of an instance "
                 "(a longer record is cut into pieces); listops: most tokens of an expression"),
      number_field("validation_fraction", &data.validation_fraction, kBelowOne)
          .about("text: share of the text held out for validation_loss"),
      // Written only when set, so that the hashes of the jobs before it stay as they were.
      choice_field("padding", &data.padding)
          .about("text-records: longest pads each key's sequences to the key's longest with "
                 "token 0, the added positions computed but not scored (the padded batches of a "
                 "framework without per-instance routes, to compare with); none runs each "
                 "sequence at its own length")
          .written_only_if([&data] { return data.padding != padding_kind::none; })};
}

/// The ListOps generator's keys, written to config.json only for listops data.
std::vector<field> listops_fields(data_config& data) {
  auto listops = [&data] { return data.dataset == dataset_kind::listops; };
  return {integer_field("max_depth", &data.max_depth, 1, 100)
              .about("listops: most nested lists in an expression")
              .written_only_if(listops),
          integer_field("max_arguments", &data.max_arguments, 2, 100)
              .about("listops: most arguments of one list (each has 2 at least)")
              .written_only_if(listops),
          integer_field("seed", &data.seed, 0)
              .about("listops: the generator's seed (the same seed, the same expressions)")
              .written_only_if(listops)};
}

std::vector<field> pipeline_fields(parallelism_config& p) {
  auto read_cuts = [&p](const toml::node& node, const std::string& label) {
    return read_partition(node, label, &p.partition);
  };
  auto read_stage_devices = [&p](const toml::node& node, const std::string& label) {
    return read_devices(node, label, &p.devices);
  };
  return {
      integer_field("stages", &p.stages, 1)
          .about("pipeline stages the model is cut into; each is an actor with its own backend"),
      field{"partition", read_cuts, [&p] { return partition_json(p.partition); }}.about(
          "\"balanced\" (estimated costs), \"measured\", \"uniform\", or cut points such as "
          "[3, 7], with \"4:784\" for a cut inside block 4 (a graph's: node indices in the order "
          "rows visit them)"),
      field{"devices", read_stage_devices, write_value(&p.devices)}.about(
          "\"cpu\", \"cuda\" or \"cuda:N\": one for every stage, one per stage, or one per stage "
          "of every replica (replica 0's first)"),
      choice_field("mode", &p.mode)
          .about("sync: M micro-batches, then every stage steps (equals sequential SGD); async: "
                 "no flush, bounded staleness"),
      choice_field("schedule", &p.schedule)
          .about("sync mode's order of forward and backward passes (zb-h1 defers weight "
                 "gradients into the bubbles)"),
      integer_field("virtual_stages", &p.virtual_stages, 1)
          .about("interleaved: stages each worker hosts (stages must be a multiple); other "
                 "schedules ignore it"),
      integer_field("micro_batches", &p.micro_batches, 1)
          .about("M: keys each batch is split into (must divide training.batch_size); an explicit "
                 "1 in a sync pipeline runs its stages one at a time")
          .default_means("unset in a sync pipeline of several stages: one key per stage"),
      integer_field("max_active_keys", &p.max_active_keys, 1)
          .about("async: most keys in flight (1 is sequential SGD)")
          .default_means("the number of stages"),
      integer_field("min_update_interval", &p.min_update_interval, 1)
          .about("async: keys whose gradients a stage sums before its optimizer steps")
          .default_means("micro_batches")};
}

std::vector<field> staleness_fields(parallelism_config& p) {
  return {
      integer_field("max_staleness", &p.max_staleness, -1)
          .about("async: most weight versions a key's backward may lag its forward")
          .default_means("unbounded")
          .for_experts(),
      bool_field("weight_stashing", &p.weight_stashing)
          .about("async: backward uses the weights its forward used (PipeDream)")
          .for_experts(),
      choice_field("staleness_correction", &p.staleness_correction)
          .about("async: how stages correct stale gradients: PipeMare, PipeDream-2BW, SpecTrain's "
                 "weight prediction or the delay-corrected Nesterov method; sync mode ignores it"),
      integer_field("correction_warmup_steps", &p.correction_warmup_steps, 0)
          .about("pipemare: steps over which the learning-rate rescheduling fades out")
          .default_means("one epoch's steps")
          .for_experts()};
}

std::vector<field> machine_fields(parallelism_config& p) {
  return {
      bool_field("recompute", &p.recompute)
          .about("transformer blocks keep only their input and recompute the rest in the "
                 "backward pass"),
      integer_field("threads", &p.threads, 0)
          .about("CPU threads the engine shares among the stages (each gets threads / stages, "
                 "at least 1)")
          .default_means("every core")
          .for_experts(),
      number_field("spin_wait_ms", &p.spin_wait_ms, kAnyNumber)
          .about("how long a stage with a core of its own polls for its next message before its "
                 "thread sleeps (0: at once)")
          .default_means("10 in sync mode, 0 in async mode")
          .for_experts(),
      integer_field("replicas", &p.replicas, 1)
          .about("copies of the whole pipeline (data parallelism), each taking batch_size / "
                 "replicas samples of every step"),
      integer_field("replica_sync_interval", &p.replica_sync_interval, 1)
          .about("async replicas: each stage averages its weights with its replicas every this "
                 "many of its steps")
          .for_experts(),
      integer_field("replica_staleness", &p.replica_staleness, -1)
          .about("async replicas: most weight versions a stage may run ahead of the slowest of "
                 "its replicas")
          .default_means("unbounded")
          .for_experts(),
      choice_field("collective", &p.collective)
          .about("how the same stage of the replicas sums: ring (troupe's ZeroMQ path, any "
                 "device), nccl (one GPU per replica), shared_memory (CPU replicas in one process)")
          .for_experts()};
}

std::vector<field> parallelism_fields(parallelism_config& p) {
  return joined(joined(pipeline_fields(p), staleness_fields(p)), machine_fields(p));
}

std::vector<field> optimizer_fields(training_config& t) {
  return {
      choice_field("optimizer", &t.optimizer)
          .about("the update rule, as PyTorch's SGD, Adam and AdamW (decoupled weight decay)"),
      number_field("lr", &t.lr, kPositive).about("learning rate"),
      number_field("momentum", &t.momentum, kBelowOne).about("SGD's momentum"),
      bool_field("nesterov", &t.nesterov)
          .about("Nesterov's look-ahead: SGD with momentum as PyTorch's nesterov=True; Adam and "
                 "AdamW become NAdam"),
      number_field("weight_decay", &t.weight_decay, kNonNegative)
          .about("L2 penalty (SGD and Adam add it to the gradient; AdamW decays the weights)"),
      number_field("beta1", &t.beta1, kBelowOne).about("Adam: decay of the gradient's mean"),
      number_field("beta2", &t.beta2, kBelowOne).about("Adam: decay of the gradient's square"),
      number_field("epsilon", &t.epsilon, kPositive).about("Adam: added to the denominator"),
      number_field("clip_norm", &t.clip_norm, kNonNegative)
          .about("scale gradients down to this L2 norm: all stages together in sync mode, each "
                 "stage in async mode")
          .default_means("off"),
      choice_field("lr_schedule", &t.lr_schedule)
          .about("how the learning rate changes: cosine decays it to 0 over the run, step "
                 "multiplies it by lr_decay every lr_decay_epochs"),
      number_field("lr_decay", &t.lr_decay, kPositive).about("step: the factor"),
      integer_field("lr_decay_epochs", &t.lr_decay_epochs, 0)
          .about("step: epochs between decays (>= 1 with step)"),
      integer_field("warmup_steps", &t.warmup_steps, 0)
          .about("steps of linear warm-up of the learning rate")};
}

std::vector<field> length_fields(training_config& t) {
  return {integer_field("batch_size", &t.batch_size, 1).about("samples per optimizer step"),
          integer_field("epochs", &t.epochs, 0)
              .about("passes over the training set (0 only evaluates the initial weights)"),
          integer_field("max_steps", &t.max_steps, 0)
              .about("stop after this many steps, or at the end of the epochs if sooner")
              .default_means("no limit")};
}

std::vector<field> evaluation_fields(training_config& t) {
  return {integer_field("seed", &t.seed, 0)
              .about("one seed drives initialization, shuffling and dropout"),
          number_field("target_accuracy", &t.target_accuracy, kUnit)
              .about("test accuracy whose first crossing summary.json reports as "
                     "time_to_target_s")
              .default_means("unset"),
          integer_field("eval_interval_steps", &t.eval_interval_steps, 0)
              .about("also evaluate every N steps within an epoch (untimed), to time "
                     "target_accuracy finer")
              .default_means("after each epoch only"),
          choice_field("precision", &t.precision)
              .about("GEMM arithmetic: tf32 and bf16 round the operands; sums and master "
                     "weights stay fp32")};
}

std::vector<field> training_fields(training_config& t) {
  return joined(joined(length_fields(t), optimizer_fields(t)), evaluation_fields(t));
}

std::vector<field> checkpoint_fields(checkpoint_config& c) {
  return {
      string_field("dir", &c.dir).about("where checkpoints go").default_means("OUT/checkpoints"),
      integer_field("interval_steps", &c.interval_steps, 0)
          .about("checkpoint every N steps, and at the end of the run")
          .default_means("never"),
      number_field("interval_s", &c.interval_s, kNonNegative)
          .about("checkpoint every S seconds, and at the end of the run")
          .default_means("never"),
      integer_field("keep_last", &c.keep_last, 1)
          .about("committed checkpoints kept; older ones are pruned"),
      integer_field("max_restarts", &c.max_restarts, 0)
          .about("lost workers recovered from before the run gives up"),
      number_field("rejoin_timeout_s", &c.rejoin_timeout_s, kNonNegative)
          .about("launchers: seconds a lost rank may take to come back")
          .for_experts()};
}

std::vector<field> metrics_fields(metrics_config& m) {
  return {integer_field("log_interval", &m.log_interval, 1)
              .about("steps between lines of metrics.jsonl and the log"),
          bool_field("trace", &m.trace)
              .about("write trace.json, the pipeline's timeline (Perfetto, chrome://tracing)"),
          bool_field("progress", &m.progress).about("progress bar when stderr is a terminal"),
          number_field("stall_timeout_s", &m.stall_timeout_s, kNonNegative)
              .about("keys in flight and no report for this long: print and log a stall report")
              .default_means("no watch")
              .for_experts()};
}

}  // namespace

std::vector<section> job_schema(job_config& config) {
  return {{"model", model_fields(config.model)},
          {"data", joined(data_fields(config.data), listops_fields(config.data))},
          {"parallelism", parallelism_fields(config.parallelism)},
          {"training", training_fields(config.training)},
          {"checkpoint", checkpoint_fields(config.checkpoint)},
          {"metrics", metrics_fields(config.metrics)}};
}

layer_spec layer_with_defaults(const std::string& type) {
  layer_spec spec;
  spec.type = type;
  if (type == "conv2d") spec.stride = 1;
  if (type == "maxpool2d") spec.kernel = 2;
  if (type == "dropout") spec.probability = 0.5f;
  if (type == "lm_head") spec.bias = false;  // GPT-2's head has none
  return spec;
}

std::vector<field> layer_fields(layer_spec& spec) {
  const std::string& type = spec.type;
  if (type == "linear") {
    return {required(integer_field("out", &spec.out, 1)).about("output features"),
            bias_field(spec)};
  }
  if (type == "conv2d") return convolution_fields(spec);
  if (type == "maxpool2d") {
    return {integer_field("kernel", &spec.kernel, 1).about("side of the square window"),
            integer_field("stride", &spec.stride, 1)
                .about("step between windows")
                .default_means("the kernel")};
  }
  if (type == "dropout") {
    return {probability_field("p", &spec.probability).about("probability of zeroing an element")};
  }
  if (type == "embedding") {
    return {vocab_field(spec),
            required(integer_field("dim", &spec.dim, 1)).about("width of a token's vector"),
            integer_field("positions", &spec.positions, 0)
                .about("learned positions (in a model graph: counted from 0 in each instance)")
                .default_means("the input's length")};
  }
  if (type == "transformer_block") {
    return {required(integer_field("heads", &spec.heads, 1))
                .about("attention heads (must divide the width)"),
            integer_field("mlp_ratio", &spec.mlp_ratio, 1).about("MLP width over model width"),
            probability_field("dropout", &spec.dropout).about("residual dropout probability")};
  }
  if (type == "lm_head") return {vocab_field(spec), bias_field(spec)};
  if (type == "lstm_cell" || type == "tree_lstm_cell") {
    std::vector<field> fields = {
        required(integer_field("out", &spec.out, 1)).about("hidden size H: rows out are [h | c]"),
        bias_field(spec)};
    if (type == "tree_lstm_cell") {
      fields.push_back(integer_field("arity", &spec.arity, 1).about("children per tree node"));
    }
    return fields;
  }
  return custom_layer_fields(spec);
}

std::string layer_type_description(const std::string& type) {
  static const std::map<std::string, std::string> descriptions = {
      {"linear",
       "fully connected over the last dimension of [features] or [T, features]; put a flatten "
       "before it on images"},
      {"relu", "max(x, 0)"},
      {"tanh", "hyperbolic tangent"},
      {"gelu", "GELU, the exact erf form"},
      {"conv2d", "2-D convolution over NCHW images (im2col and GEMM)"},
      {"maxpool2d", "the maximum of every window"},
      {"flatten", "one dimension of features per sample"},
      {"dropout", "inverted dropout, masks drawn from the seed, the step and the sample"},
      {"embedding", "token ids [T] to [T, dim]: a learned row per token plus one per position"},
      {"layernorm", "over the last dimension, epsilon 1e-5 (PyTorch's nn.LayerNorm)"},
      {"transformer_block",
       "GPT-2's pre-LayerNorm block: causal self-attention and a GELU MLP, each with its "
       "residual"},
      {"lm_head", "a linear to the vocabulary over every token: [T, vocab] logits"},
      {"lstm_cell", "PyTorch's LSTMCell over rows [x | h | c], each to [h' | c']"},
      {"tree_lstm_cell",
       "the N-ary Tree-LSTM cell (Tai et al. 2015) over rows [x | h_1 | c_1 | ... | h_N | c_N], "
       "each to [h | c]"}};
  const auto found = descriptions.find(type);
  return found == descriptions.end() ? "" : found->second;
}

}  // namespace troupe::actors::detail
