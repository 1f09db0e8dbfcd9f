#include "actors/config/job_file.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>

#include "actors/config/job_checks.h"
#include "actors/config/job_warnings.h"
#include "actors/config/layer_cuts.h"
#include "actors/config/toml_fields.h"
#include "layers/layer_registry.h"

namespace troupe::actors {
namespace {

using namespace detail;  // the generic readers and field builders of toml_fields.h
using layers::layer_spec;

// model.layers -----------------------------------------------------------------------------------

/// The shortest decimal that reads back as `value`, widened: 0.1f gives 0.1, not 0.10000000149.
double widen(float value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::strtod(std::string(buffer, result.ptr).c_str(), nullptr);
}

field probability_field(const char* name, float* probability) {
  auto read = [probability](const toml::node& node, const std::string& label) -> problem {
    double p = 0;
    if (problem error = read_number(node, label, kBelowOne, &p)) return error;
    *probability = static_cast<float>(p);  // 0.99999999999 would round to 1
    if (*probability >= 1.0f) return label + " must be in [0, 1), got " + format_number(p);
    return std::nullopt;
  };
  return {name, read, [probability] { return nlohmann::json(widen(*probability)); }};
}

/// The keys a layer of `spec.type` takes, besides `type`.
std::vector<field> layer_fields(layer_spec& spec) {
  field out = required(integer_field("out", &spec.out, 1));
  field bias = bool_field("bias", &spec.bias);
  if (spec.type == "linear") return {out, bias};
  if (spec.type == "conv2d") {
    return {out, required(integer_field("kernel", &spec.kernel, 1)),
            integer_field("stride", &spec.stride, 1), integer_field("padding", &spec.padding, 0),
            bias};
  }
  if (spec.type == "maxpool2d") {
    return {integer_field("kernel", &spec.kernel, 1), integer_field("stride", &spec.stride, 1)};
  }
  if (spec.type == "dropout") return {probability_field("p", &spec.probability)};
  field vocab = required(integer_field("vocab", &spec.vocab, 1));
  if (spec.type == "embedding") {
    return {vocab, required(integer_field("dim", &spec.dim, 1)),
            integer_field("positions", &spec.positions, 0)};
  }
  if (spec.type == "layernorm") return {};
  if (spec.type == "transformer_block") {
    return {required(integer_field("heads", &spec.heads, 1)),
            integer_field("mlp_ratio", &spec.mlp_ratio, 1),
            probability_field("dropout", &spec.dropout)};
  }
  if (spec.type == "lm_head") return {vocab, bias};
  std::vector<field> fields;
  if (const layers::custom_layer_type* custom = layers::find_custom_layer_type(spec.type)) {
    if (custom->uses_out) fields = {out, bias};
    for (const std::string& name : custom->options) {
      spec.options.emplace(name, 0.0);
      fields.push_back(number_field(name, &spec.options[name], kAnyNumber));
    }
  }
  return fields;
}

problem read_layer(const toml::node& node, const std::string& where, layer_spec* spec) {
  const auto* table = node.as_table();
  if (table == nullptr) return wrong_type(where, "a table such as { type = \"relu\" }", node);
  const toml::node* type = table->get("type");
  if (type == nullptr) return where + ": missing required key 'type'";
  if (problem error = read_string(*type, where + ".type", layers::layer_type_names(), &spec->type))
    return error;
  if (spec->type == "conv2d") spec->stride = 1;
  if (spec->type == "maxpool2d") spec->kernel = 2;
  if (spec->type == "dropout") spec->probability = 0.5f;
  if (spec->type == "lm_head") spec->bias = false;  // GPT-2's head has none
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

std::vector<field> model_fields(model_config& model) {
  auto read_layers = [&model](const toml::node& node, const std::string& label) {
    return read_array(node, label, "an array of layer tables", read_layer, &model.layers);
  };
  auto read_shape = [&model](const toml::node& node, const std::string& label) {
    return read_array(node, label, "an array of positive integers", read_positive,
                      &model.input_shape);
  };
  return {required({"layers", read_layers, [&model] { return layers_json(model.layers); }}),
          {"input_shape", read_shape, write_value(&model.input_shape)},
          string_field("loss", &model.loss, {"softmax_cross_entropy"}),
          string_field("init_from", &model.init_from)};
}

// parallelism.devices and parallelism.partition --------------------------------------------------

problem read_device(const toml::node& node, const std::string& label, std::string* out) {
  if (problem error = read_string(node, label, {}, out)) return error;
  const std::string& name = *out;
  const bool numbered =
      name.size() > 5 && name.size() <= 8 && name.rfind("cuda:", 0) == 0 &&
      std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (name == "cpu" || name == "cuda" || numbered) return std::nullopt;
  return label + " must be \"cpu\", \"cuda\" or \"cuda:N\", got '" + name + "'";
}

/// A string names the device of every stage; an array names one per stage.
problem read_devices(const toml::node& node, const std::string& label,
                     std::vector<std::string>* out) {
  if (!node.is_string()) {
    return read_array(node, label, "a device name or an array of them", read_device, out);
  }
  std::string device;
  if (problem error = read_device(node, label, &device)) return error;
  return *out = {device}, std::nullopt;
}

/// One cut point of an array: a block index, or "block:row" for a cut inside a linear layer.
problem read_cut(const toml::node& node, const std::string& label, std::string* out) {
  const std::optional<std::string> text = node.value_exact<std::string>();
  std::vector<cut_point> cut;
  if (text && parse_cut_points(*text, &cut) && cut.size() == 1) {
    return *out = cut_points_text(cut), std::nullopt;
  }
  int64_t block = 0;
  if (!node.is_integer()) {
    return label + " must be a block index such as 3, or \"3:512\" to cut inside a linear layer" +
           (text ? ", got '" + *text + "'" : "");
  }
  if (problem error = read_positive(node, label, &block)) return error;
  return *out = std::to_string(block), std::nullopt;
}

/// "balanced", "measured", "uniform", an array of cut points, or cut points as a string ("3,7",
/// so that `--set parallelism.partition=3,7` works); cut points are stored comma-joined.
problem read_partition(const toml::node& node, const std::string& label, std::string* out) {
  const std::string expected =
      "\"balanced\", \"measured\", \"uniform\" or an array of cut points such as [3, 7] or "
      "[\"4:784\"] (block 4 from its output 784 on)";
  const std::optional<std::string> text = node.value_exact<std::string>();
  if (node.is_array()) {
    std::vector<std::string> cuts;
    if (problem error = read_array(node, label, expected, read_cut, &cuts)) return error;
    std::string joined;
    for (const std::string& cut : cuts) joined += (joined.empty() ? "" : ",") + cut;
    return *out = joined, std::nullopt;
  }
  if (!text) return wrong_type(label, expected, node);
  std::vector<cut_point> cuts;
  if (*text == "balanced" || *text == "measured" || *text == "uniform") {
    return *out = *text, std::nullopt;
  }
  if (!parse_cut_points(*text, &cuts)) {
    return label + " must be " + expected + ", got '" + *text + "'";
  }
  return *out = cut_points_text(cuts), std::nullopt;
}

/// Cut points as an array: block indices as numbers, cuts inside a layer as "block:row".
nlohmann::json partition_json(const std::string& partition) {
  std::vector<cut_point> cuts;
  if (!parse_cut_points(partition, &cuts)) return partition;
  nlohmann::json json = nlohmann::json::array();
  for (const cut_point& cut : cuts) {
    if (cut.row > 0) {
      json.push_back(cut_points_text({cut}));
    } else {
      json.push_back(cut.block);
    }
  }
  return json;
}

// The schema: every job-file key and where its value goes ----------------------------------------

std::vector<field> data_fields(data_config& data) {
  return {string_field("dataset", &data.dataset, {"fashion-mnist", "synthetic", "text"}),
          string_field("path", &data.path),
          bool_field("shuffle", &data.shuffle),
          bool_field("normalize", &data.normalize),
          integer_field("train_samples", &data.train_samples, 0),
          integer_field("test_samples", &data.test_samples, 0),
          integer_field("synthetic_train", &data.synthetic_train, 1),
          integer_field("synthetic_test", &data.synthetic_test, 1),
          integer_field("classes", &data.classes, 2),
          integer_field("context", &data.context, 1),
          number_field("validation_fraction", &data.validation_fraction, kBelowOne)};
}

std::vector<field> parallelism_fields(parallelism_config& p) {
  auto read_cuts = [&p](const toml::node& node, const std::string& label) {
    return read_partition(node, label, &p.partition);
  };
  auto read_stage_devices = [&p](const toml::node& node, const std::string& label) {
    return read_devices(node, label, &p.devices);
  };
  return {integer_field("stages", &p.stages, 1),
          {"partition", read_cuts, [&p] { return partition_json(p.partition); }},
          {"devices", read_stage_devices, write_value(&p.devices)},
          string_field("mode", &p.mode, {"sync", "async"}),
          string_field("schedule", &p.schedule, {"gpipe", "1f1b", "zb-h1", "interleaved"}),
          integer_field("virtual_stages", &p.virtual_stages, 1),
          integer_field("micro_batches", &p.micro_batches, 1),
          integer_field("max_active_keys", &p.max_active_keys, 1),
          integer_field("min_update_interval", &p.min_update_interval, 1),
          integer_field("max_staleness", &p.max_staleness, -1),
          bool_field("weight_stashing", &p.weight_stashing),
          string_field("staleness_correction", &p.staleness_correction,
                       {"none", "pipemare", "2bw", "predict", "nesterov"}),
          integer_field("correction_warmup_steps", &p.correction_warmup_steps, 0),
          bool_field("recompute", &p.recompute),
          integer_field("threads", &p.threads, 0),
          number_field("spin_wait_ms", &p.spin_wait_ms, kAnyNumber),
          integer_field("replicas", &p.replicas, 1),
          integer_field("replica_sync_interval", &p.replica_sync_interval, 1),
          integer_field("replica_staleness", &p.replica_staleness, -1),
          string_field("collective", &p.collective, {"ring", "nccl", "shared_memory"})};
}

std::vector<field> training_fields(training_config& t) {
  return {integer_field("batch_size", &t.batch_size, 1),
          integer_field("epochs", &t.epochs, 0),
          integer_field("max_steps", &t.max_steps, 0),
          string_field("optimizer", &t.optimizer, {"sgd", "adam", "adamw"}),
          number_field("lr", &t.lr, kPositive),
          number_field("momentum", &t.momentum, kBelowOne),
          bool_field("nesterov", &t.nesterov),
          number_field("weight_decay", &t.weight_decay, kNonNegative),
          number_field("beta1", &t.beta1, kBelowOne),
          number_field("beta2", &t.beta2, kBelowOne),
          number_field("epsilon", &t.epsilon, kPositive),
          number_field("clip_norm", &t.clip_norm, kNonNegative),
          string_field("lr_schedule", &t.lr_schedule, {"constant", "cosine", "step"}),
          number_field("lr_decay", &t.lr_decay, kPositive),
          integer_field("lr_decay_epochs", &t.lr_decay_epochs, 0),
          integer_field("warmup_steps", &t.warmup_steps, 0),
          integer_field("seed", &t.seed, 0),
          number_field("target_accuracy", &t.target_accuracy, kUnit),
          integer_field("eval_interval_steps", &t.eval_interval_steps, 0),
          string_field("precision", &t.precision, {"fp32", "tf32", "bf16"})};
}

/// Every section and key, bound to `config`, in the order messages and checks use.
std::vector<section> job_schema(job_config& config) {
  checkpoint_config& c = config.checkpoint;
  metrics_config& m = config.metrics;
  return {{"model", model_fields(config.model)},
          {"data", data_fields(config.data)},
          {"parallelism", parallelism_fields(config.parallelism)},
          {"training", training_fields(config.training)},
          {"checkpoint",
           {string_field("dir", &c.dir), integer_field("interval_steps", &c.interval_steps, 0),
            number_field("interval_s", &c.interval_s, kNonNegative),
            integer_field("keep_last", &c.keep_last, 1),
            integer_field("max_restarts", &c.max_restarts, 0),
            number_field("rejoin_timeout_s", &c.rejoin_timeout_s, kNonNegative)}},
          {"metrics",
           {integer_field("log_interval", &m.log_interval, 1), bool_field("trace", &m.trace),
            bool_field("progress", &m.progress),
            number_field("stall_timeout_s", &m.stall_timeout_s, kNonNegative)}}};
}

/// "section.key" for every key of every section that `root` (the file with its overrides) sets.
std::set<std::string> keys_set_in(const toml::table& root) {
  std::set<std::string> keys;
  for (const auto& [name, node] : root) {
    if (const toml::table* table = node.as_table()) {
      for (const auto& entry : *table) {
        keys.insert(std::string(name.str()) + "." + std::string(entry.first.str()));
      }
    }
  }
  return keys;
}

problem read_job(const toml::table& root, const std::set<std::string>& overridden,
                 const std::set<std::string>& set_keys, job_config* config) {
  const std::vector<section> schema = job_schema(*config);
  std::vector<std::string> section_names, key_names;
  for (const auto& s : schema) {
    section_names.push_back(s.name);
    for (const auto& f : s.fields) key_names.push_back(s.name + "." + f.name);
  }
  for (const auto& [key, node] : root) {
    const std::string name(key.str());
    const bool known = std::count(section_names.begin(), section_names.end(), name) > 0;
    if (known && !node.is_table()) return wrong_type(name, "a table", node);
    if (!known && node.is_table()) {
      return "unknown section '" + name + "'" + suggestion(name, section_names);
    }
    if (!known) return "unknown key '" + name + "'" + suggestion(name, key_names);
  }
  static const toml::table kEmpty;
  for (const auto& s : schema) {
    const toml::table* table = root.get_as<toml::table>(s.name);
    const naming names{"", s.name + ".", key_names, &overridden};
    if (problem error = read_fields(table ? *table : kEmpty, s.fields, names)) return error;
  }
  return check_consistency(config, set_keys);
}

std::optional<job_config> fail(job_error* error, std::string message) {
  if (error != nullptr) error->message = std::move(message);
  return std::nullopt;
}

std::optional<job_config> parse_job_or_throw(const std::string& toml_text,
                                             const std::string& source_name,
                                             const std::vector<std::string>& overrides,
                                             job_error* error, std::vector<std::string>* warnings) {
  toml::table root;
  if (problem message = parse_toml(toml_text, source_name, &root)) return fail(error, *message);
  std::set<std::string> overridden;
  for (const auto& text : overrides) {
    if (problem message = apply_override(text, &root, &overridden)) {
      return fail(error, source_name + ": " + *message);
    }
  }
  job_config config;
  const std::set<std::string> set_keys = keys_set_in(root);
  if (problem message = read_job(root, overridden, set_keys, &config)) {
    return fail(error, source_name + ": " + *message);
  }
  if (warnings != nullptr) {
    warnings->clear();
    for (const std::string& warning : job_warnings(config, set_keys)) {
      warnings->push_back(source_name + ": " + warning);
    }
  }
  return config;
}

}  // namespace

std::optional<job_config> parse_job(const std::string& toml_text, const std::string& source_name,
                                    const std::vector<std::string>& overrides, job_error* error,
                                    std::vector<std::string>* warnings) {
  try {
    return parse_job_or_throw(toml_text, source_name, overrides, error, warnings);
  } catch (const std::exception& exception) {
    return fail(error, source_name + ": " + exception.what());
  }
}

std::optional<job_config> load_job_file(const std::string& path,
                                        const std::vector<std::string>& overrides, job_error* error,
                                        std::vector<std::string>* warnings) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (file == nullptr) {
    return fail(error, "cannot open job file '" + path + "': " + std::strerror(errno));
  }
  std::string text;
  char buffer[1 << 14];
  size_t count = 0;
  while ((count = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) text.append(buffer, count);
  if (std::ferror(file.get())) {
    return fail(error, "cannot read job file '" + path + "': " + std::strerror(errno));
  }
  return parse_job(text, path, overrides, error, warnings);
}

nlohmann::json to_json(const job_config& config) {
  // The job as its file writes it (a cut linear layer whole); the schema binds to a mutable
  // config, and writing only reads it.
  job_config copy = written_job(config);
  nlohmann::json json = nlohmann::json::object();
  for (const auto& s : job_schema(copy)) {
    nlohmann::json& keys = json[s.name] = nlohmann::json::object();
    for (const auto& f : s.fields) keys[f.name] = f.write();
  }
  return json;
}

namespace {

std::string fnv1a_hex(const nlohmann::json& json) {
  const std::string text = json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  uint64_t hash = 14695981039346656037ull;  // FNV-1a 64
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

}  // namespace

std::string config_hash(const job_config& config) { return fnv1a_hex(to_json(config)); }

std::string job_identity_hash(const job_config& config) {
  return checkpoint_config_hash(config) + "-r" + std::to_string(config.parallelism.replicas);
}

std::string checkpoint_config_hash(const job_config& config) {
  nlohmann::json json = to_json(config);
  json.erase("checkpoint");
  json.erase("metrics");
  for (const char* key : {"epochs", "max_steps", "target_accuracy", "eval_interval_steps"}) {
    json["training"].erase(key);
  }
  // A run may resume with another number of replicas: a checkpoint holds one copy of each stage.
  for (const char* key : {"threads", "spin_wait_ms", "devices", "replicas", "collective"}) {
    json["parallelism"].erase(key);
  }
  json["model"].erase("init_from");
  return fnv1a_hex(json);
}

}  // namespace troupe::actors
