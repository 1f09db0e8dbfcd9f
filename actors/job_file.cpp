#include "actors/job_file.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>

#include <toml++/toml.h>

namespace troupe::actors {
namespace {

using layers::layer_spec;

/// A message without the source name in front; nothing when all is well.
using problem = std::optional<std::string>;
/// Reads one node into the configuration; `label` names the key in messages.
using reader = std::function<problem(const toml::node& node, const std::string& label)>;

/// One key a table may hold.
struct field {
  std::string name;
  reader read;
  bool required = false;
};

/// How read_fields() names what it reads: "training.lr", or "model.layers[2] (conv2d): out".
struct naming {
  std::string context;     ///< in front of every message ("" or "model.layers[2] (conv2d): ")
  std::string key_prefix;  ///< in front of every key ("training." or "")
  std::vector<std::string> suggestions;     ///< full key names offered for unknown keys
  const std::set<std::string>* overridden;  ///< full keys set by --set (may be null)
};

/// Numeric ranges the job keys use.
enum class number_range { positive, non_negative, below_one, unit };

const std::vector<std::string> kLayerTypes = {"linear", "relu",      "tanh",    "gelu",
                                              "conv2d", "maxpool2d", "flatten", "dropout"};

std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

problem wrong_type(const std::string& label, const std::string& expected, const toml::node& node) {
  return label + " must be " + expected + ", got " + describe(node);
}

std::string format_number(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

/// Optimal string alignment distance: insertions, deletions, substitutions, transpositions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::string last_part(const std::string& key) { return key.substr(key.rfind('.') + 1); }

/// "; did you mean 'X'?" for the closest candidate within two edits (or, failing that, one whose
/// last dotted part equals the typed one's), else "".
std::string suggestion(const std::string& typed, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  size_t best_distance = 3;
  for (const auto& candidate : candidates) {
    const size_t distance = edit_distance(typed, candidate);
    if (distance < best_distance) best = &candidate, best_distance = distance;
  }
  for (const auto& candidate : candidates) {
    if (best == nullptr && last_part(candidate) == last_part(typed)) best = &candidate;
  }
  return best == nullptr ? "" : "; did you mean '" + *best + "'?";
}

std::string quoted_list(const std::vector<std::string>& words) {
  std::string text;
  for (const auto& word : words) text += (text.empty() ? "'" : ", '") + word + "'";
  return text;
}

// Readers of one value -------------------------------------------------------------------------

problem read_integer(const toml::node& node, const std::string& label, int64_t min, int64_t max,
                     int64_t* out) {
  const auto* value = node.as_integer();
  if (value == nullptr) return wrong_type(label, "an integer", node);
  const int64_t number = value->get();
  if (number >= min && number <= max) return *out = number, std::nullopt;
  const bool unbounded = max >= std::numeric_limits<int>::max();
  const std::string range = !unbounded
                                ? "in [" + std::to_string(min) + ", " + std::to_string(max) + "]"
                            : number < min ? ">= " + std::to_string(min)
                                           : "<= " + std::to_string(max);
  return label + " must be " + range + ", got " + std::to_string(number);
}

bool in_range(double value, number_range range) {
  switch (range) {
    case number_range::positive:
      return value > 0;
    case number_range::non_negative:
      return value >= 0;
    case number_range::below_one:
      return value >= 0 && value < 1;
    case number_range::unit:
      return value >= 0 && value <= 1;
  }
  return false;
}

const char* range_text(number_range range) {
  switch (range) {
    case number_range::positive:
      return "> 0";
    case number_range::non_negative:
      return ">= 0";
    case number_range::below_one:
      return "in [0, 1)";
    case number_range::unit:
      return "in [0, 1]";
  }
  return "";
}

/// Integers are accepted where a number is expected.
problem read_number(const toml::node& node, const std::string& label, number_range range,
                    double* out) {
  double number = 0;
  if (const auto* integer = node.as_integer()) {
    number = static_cast<double>(integer->get());
  } else if (const auto* floating = node.as_floating_point()) {
    number = floating->get();
  } else {
    return wrong_type(label, "a number", node);
  }
  if (!std::isfinite(number))
    return label + " must be a finite number, got " + format_number(number);
  if (!in_range(number, range)) {
    return label + " must be " + range_text(range) + ", got " + format_number(number);
  }
  return *out = number, std::nullopt;
}

problem read_string(const toml::node& node, const std::string& label,
                    const std::vector<std::string>& choices, std::string* out) {
  const auto* value = node.as_string();
  if (value == nullptr) return wrong_type(label, "a string", node);
  const std::string& text = value->get();
  if (choices.empty() || std::find(choices.begin(), choices.end(), text) != choices.end()) {
    return *out = text, std::nullopt;
  }
  return label + " must be one of " + quoted_list(choices) + ", got '" + text + "'" +
         suggestion(text, choices);
}

problem read_bool(const toml::node& node, const std::string& label, bool* out) {
  const auto* value = node.as_boolean();
  if (value == nullptr) return wrong_type(label, "a boolean", node);
  return *out = value->get(), std::nullopt;
}

// Field builders -------------------------------------------------------------------------------

template <typename T>
constexpr int64_t largest() {
  return static_cast<int64_t>(
      std::min<uint64_t>(std::numeric_limits<T>::max(), std::numeric_limits<int64_t>::max()));
}

template <typename T>
field integer_field(std::string name, T* target, int64_t min, int64_t max = largest<T>()) {
  return {std::move(name), [target, min, max](const toml::node& node, const std::string& label) {
            int64_t value = 0;
            problem error = read_integer(node, label, min, max, &value);
            if (!error) *target = static_cast<T>(value);
            return error;
          }};
}

field number_field(std::string name, double* target, number_range range) {
  return {std::move(name), [target, range](const toml::node& node, const std::string& label) {
            return read_number(node, label, range, target);
          }};
}

field string_field(std::string name, std::string* target, std::vector<std::string> choices = {}) {
  return {std::move(name), [target, choices](const toml::node& node, const std::string& label) {
            return read_string(node, label, choices, target);
          }};
}

field bool_field(std::string name, bool* target) {
  return {std::move(name), [target](const toml::node& node, const std::string& label) {
            return read_bool(node, label, target);
          }};
}

field required(field f) {
  f.required = true;
  return f;
}

/// Reads every key of `table` named by `fields` (a key missing from `table` keeps its default)
/// and rejects any other key except those in `ignored`.
problem read_fields(const toml::table& table, const std::vector<field>& fields, const naming& names,
                    const std::vector<std::string>& ignored = {}) {
  auto from_override = [&](const std::string& key) {
    return names.overridden != nullptr && names.overridden->count(key) ? " (from --set)" : "";
  };
  for (const auto& [key, node] : table) {
    const std::string name(key.str());
    const std::string full = names.key_prefix + name;
    const bool known =
        std::any_of(fields.begin(), fields.end(), [&](const field& f) { return f.name == name; });
    if (!known && std::find(ignored.begin(), ignored.end(), name) == ignored.end()) {
      return names.context + "unknown key '" + full + "'" + from_override(full) +
             suggestion(full, names.suggestions);
    }
  }
  for (const auto& f : fields) {
    const std::string full = names.key_prefix + f.name;
    const toml::node* node = table.get(f.name);
    if (node == nullptr && f.required) return names.context + "missing required key '" + full + "'";
    if (node == nullptr) continue;
    if (problem error = f.read(*node, names.context + full)) return *error + from_override(full);
  }
  return std::nullopt;
}

// Keys that need more than one value reader ------------------------------------------------------

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
  if (spec.type != "dropout") return {};
  return {{"p", [&spec](const toml::node& node, const std::string& label) -> problem {
             double p = 0;
             if (problem error = read_number(node, label, number_range::below_one, &p))
               return error;
             spec.probability = static_cast<float>(p);
             if (spec.probability >= 1.0f)
               return label + " must be in [0, 1), got " + format_number(p);
             return std::nullopt;
           }}};
}

problem read_layer(const toml::node& node, size_t index, layer_spec* spec) {
  const std::string where = "model.layers[" + std::to_string(index) + "]";
  const auto* table = node.as_table();
  if (table == nullptr) return wrong_type(where, "a table such as { type = \"relu\" }", node);
  const toml::node* type = table->get("type");
  if (type == nullptr) return where + ": missing required key 'type'";
  if (problem error = read_string(*type, where + ".type", kLayerTypes, &spec->type)) return error;
  if (spec->type == "conv2d") spec->stride = 1;
  if (spec->type == "maxpool2d") spec->kernel = 2;
  if (spec->type == "dropout") spec->probability = 0.5f;
  const std::vector<field> fields = layer_fields(*spec);
  naming names{where + " (" + spec->type + "): ", "", {}, nullptr};
  for (const auto& f : fields) names.suggestions.push_back(f.name);
  if (problem error = read_fields(*table, fields, names, {"type"})) return error;
  if (spec->type == "maxpool2d" && table->get("stride") == nullptr) spec->stride = spec->kernel;
  return std::nullopt;
}

problem read_layers(const toml::node& node, const std::string& label,
                    std::vector<layer_spec>* out) {
  const auto* array = node.as_array();
  if (array == nullptr) return wrong_type(label, "an array of layer tables", node);
  if (array->empty()) return label + " must not be empty";
  std::vector<layer_spec> specs(array->size());
  for (size_t i = 0; i < array->size(); ++i) {
    if (problem error = read_layer(*array->get(i), i, &specs[i])) return error;
  }
  return *out = std::move(specs), std::nullopt;
}

problem read_shape(const toml::node& node, const std::string& label, std::vector<int64_t>* out) {
  const auto* array = node.as_array();
  if (array == nullptr) return wrong_type(label, "an array of positive integers", node);
  if (array->empty()) return label + " must not be empty";
  std::vector<int64_t> dims(array->size());
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string element = label + "[" + std::to_string(i) + "]";
    if (problem error = read_integer(*array->get(i), element, 1, largest<int>(), &dims[i])) {
      return error;
    }
  }
  return *out = std::move(dims), std::nullopt;
}

bool valid_device(const std::string& name) {
  if (name == "cpu" || name == "cuda") return true;
  if (name.rfind("cuda:", 0) != 0 || name.size() == 5 || name.size() > 8) return false;
  return std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

problem device_error(const std::string& label, const std::string& name) {
  return label + " must be \"cpu\", \"cuda\" or \"cuda:N\", got '" + name + "'";
}

/// A string names the device of every stage; an array names one per stage.
problem read_devices(const toml::node& node, const std::string& label,
                     std::vector<std::string>* out) {
  if (const auto* name = node.as_string()) {
    if (!valid_device(name->get())) return device_error(label, name->get());
    return *out = {name->get()}, std::nullopt;
  }
  const auto* array = node.as_array();
  if (array == nullptr) return wrong_type(label, "a device name or an array of them", node);
  if (array->empty()) return label + " must not be empty";
  std::vector<std::string> devices(array->size());
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string element = label + "[" + std::to_string(i) + "]";
    if (problem error = read_string(*array->get(i), element, {}, &devices[i])) return error;
    if (!valid_device(devices[i])) return device_error(element, devices[i]);
  }
  return *out = std::move(devices), std::nullopt;
}

/// Parses "3,7" into cut points; false unless every part is a positive integer.
bool parse_cut_points(const std::string& text, std::vector<int64_t>* cuts) {
  cuts->clear();
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string part = trim(text.substr(start, comma - start));
    int64_t value = 0;
    const auto result = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || result.ec != std::errc() || result.ptr != part.data() + part.size() ||
        value < 1) {
      return false;
    }
    cuts->push_back(value);
    start = comma + 1;
  }
  return !cuts->empty();
}

std::string join_cuts(const std::vector<int64_t>& cuts) {
  std::string joined;
  for (int64_t cut : cuts) joined += (joined.empty() ? "" : ",") + std::to_string(cut);
  return joined;
}

/// "balanced", "uniform", an array of cut points, or cut points as a string ("3,7", so that
/// `--set parallelism.partition=3,7` works); cut points are stored comma-joined.
problem read_partition(const toml::node& node, const std::string& label, std::string* out) {
  const std::string expected = "\"balanced\", \"uniform\" or an array of cut points such as [3, 7]";
  std::vector<int64_t> cuts;
  if (const auto* array = node.as_array()) {
    if (array->empty()) return label + " must be " + expected + ", got an empty array";
    cuts.resize(array->size());
    for (size_t i = 0; i < array->size(); ++i) {
      const std::string element = label + "[" + std::to_string(i) + "]";
      if (problem error = read_integer(*array->get(i), element, 1, largest<int>(), &cuts[i])) {
        return error;
      }
    }
    return *out = join_cuts(cuts), std::nullopt;
  }
  const auto* text = node.as_string();
  if (text == nullptr) return wrong_type(label, expected, node);
  const std::string& value = text->get();
  if (value == "balanced" || value == "uniform") return *out = value, std::nullopt;
  if (!parse_cut_points(value, &cuts))
    return label + " must be " + expected + ", got '" + value + "'";
  return *out = join_cuts(cuts), std::nullopt;
}

// The schema: every job-file key and where its value goes ----------------------------------------

struct section {
  std::string name;
  std::vector<field> fields;
};

std::vector<field> model_fields(model_config& model) {
  return {
      required(
          {"layers",
           [&model](auto& node, auto& label) { return read_layers(node, label, &model.layers); }}),
      {"input_shape",
       [&model](auto& node, auto& label) { return read_shape(node, label, &model.input_shape); }},
      string_field("loss", &model.loss, {"softmax_cross_entropy"})};
}

std::vector<field> data_fields(data_config& data) {
  return {string_field("dataset", &data.dataset, {"fashion-mnist", "synthetic"}),
          string_field("path", &data.path),
          bool_field("shuffle", &data.shuffle),
          bool_field("normalize", &data.normalize),
          integer_field("train_samples", &data.train_samples, 0),
          integer_field("test_samples", &data.test_samples, 0),
          integer_field("synthetic_train", &data.synthetic_train, 1),
          integer_field("synthetic_test", &data.synthetic_test, 1),
          integer_field("classes", &data.classes, 2)};
}

std::vector<field> parallelism_fields(parallelism_config& p) {
  return {
      integer_field("stages", &p.stages, 1),
      {"partition",
       [&p](auto& node, auto& label) { return read_partition(node, label, &p.partition); }},
      {"devices", [&p](auto& node, auto& label) { return read_devices(node, label, &p.devices); }},
      string_field("mode", &p.mode, {"sync", "async"}),
      string_field("schedule", &p.schedule, {"gpipe", "1f1b"}),
      integer_field("micro_batches", &p.micro_batches, 1),
      integer_field("max_active_keys", &p.max_active_keys, 0),
      integer_field("min_update_interval", &p.min_update_interval, 0),
      integer_field("max_staleness", &p.max_staleness, -1),
      bool_field("weight_stashing", &p.weight_stashing),
      integer_field("threads", &p.threads, 0)};
}

std::vector<field> training_fields(training_config& t) {
  return {integer_field("batch_size", &t.batch_size, 1),
          integer_field("epochs", &t.epochs, 1),
          integer_field("max_steps", &t.max_steps, 0),
          string_field("optimizer", &t.optimizer, {"sgd", "adam"}),
          number_field("lr", &t.lr, number_range::positive),
          number_field("momentum", &t.momentum, number_range::below_one),
          number_field("weight_decay", &t.weight_decay, number_range::non_negative),
          number_field("beta1", &t.beta1, number_range::below_one),
          number_field("beta2", &t.beta2, number_range::below_one),
          number_field("epsilon", &t.epsilon, number_range::positive),
          string_field("lr_schedule", &t.lr_schedule, {"constant", "cosine", "step"}),
          number_field("lr_decay", &t.lr_decay, number_range::positive),
          integer_field("lr_decay_epochs", &t.lr_decay_epochs, 0),
          integer_field("warmup_steps", &t.warmup_steps, 0),
          integer_field("seed", &t.seed, 0),
          number_field("target_accuracy", &t.target_accuracy, number_range::unit),
          string_field("precision", &t.precision, {"fp32", "tf32", "bf16"})};
}

std::vector<section> job_schema(job_config& config) {
  checkpoint_config& c = config.checkpoint;
  metrics_config& m = config.metrics;
  return {{"model", model_fields(config.model)},
          {"data", data_fields(config.data)},
          {"parallelism", parallelism_fields(config.parallelism)},
          {"training", training_fields(config.training)},
          {"checkpoint",
           {string_field("dir", &c.dir), integer_field("interval_steps", &c.interval_steps, 0),
            number_field("interval_s", &c.interval_s, number_range::non_negative),
            integer_field("keep_last", &c.keep_last, 1)}},
          {"metrics",
           {integer_field("log_interval", &m.log_interval, 1), bool_field("trace", &m.trace),
            bool_field("progress", &m.progress)}}};
}

// Checks across keys, once every key is read -----------------------------------------------------

problem check_partition(const job_config& config) {
  const parallelism_config& p = config.parallelism;
  std::vector<int64_t> cuts;
  if (!parse_cut_points(p.partition, &cuts)) return std::nullopt;  // "balanced" or "uniform"
  if (cuts.size() + 1 != static_cast<size_t>(p.stages)) {
    return "parallelism.partition [" + p.partition + "] makes " + std::to_string(cuts.size() + 1) +
           " stages but parallelism.stages is " + std::to_string(p.stages);
  }
  const auto layer_count = static_cast<int64_t>(config.model.layers.size());
  for (size_t i = 0; i < cuts.size(); ++i) {
    if (cuts[i] >= layer_count || (i > 0 && cuts[i] <= cuts[i - 1])) {
      return "parallelism.partition [" + p.partition + "] must be increasing cut points in [1, " +
             std::to_string(layer_count - 1) + "] (model.layers has " +
             std::to_string(layer_count) + " layers)";
    }
  }
  return std::nullopt;
}

/// Rejects combinations no single key can, then resolves the defaults that depend on others.
problem check_consistency(job_config* config) {
  parallelism_config& p = config->parallelism;
  const training_config& t = config->training;
  const std::string stages = std::to_string(p.stages);
  if (t.batch_size % p.micro_batches != 0) {
    return "parallelism.micro_batches (" + std::to_string(p.micro_batches) +
           ") must divide training.batch_size (" + std::to_string(t.batch_size) + ")";
  }
  if (static_cast<size_t>(p.stages) > config->model.layers.size()) {
    return "parallelism.stages (" + stages + ") exceeds the number of layers in model.layers (" +
           std::to_string(config->model.layers.size()) + ")";
  }
  if (p.devices.size() != 1 && p.devices.size() != static_cast<size_t>(p.stages)) {
    return "parallelism.devices names " + std::to_string(p.devices.size()) +
           " devices but parallelism.stages is " + stages + " (give one, or one per stage)";
  }
  if (t.lr_schedule == "step" && t.lr_decay_epochs < 1) {
    return "training.lr_decay_epochs must be >= 1 when training.lr_schedule is 'step'";
  }
  if (problem error = check_partition(*config)) return error;
  if (p.max_active_keys == 0) p.max_active_keys = p.stages;
  if (p.min_update_interval == 0) p.min_update_interval = p.micro_batches;
  return std::nullopt;
}

problem read_job(const toml::table& root, const std::set<std::string>& overridden,
                 job_config* config) {
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
  for (const auto& s : schema) {
    const toml::table* table = root.get_as<toml::table>(s.name);
    const naming names{"", s.name + ".", key_names, &overridden};
    if (problem error = read_fields(table ? *table : toml::table{}, s.fields, names)) return error;
  }
  return check_consistency(config);
}

// Text in: TOML and overrides --------------------------------------------------------------------

/// Parses `text`; on a syntax error returns "SOURCE:LINE:COLUMN: invalid TOML: ...".
problem parse_toml(const std::string& text, const std::string& source, toml::table* root) {
  try {
    *root = toml::parse(std::string_view(text), std::string_view(source));
    return std::nullopt;
  } catch (const toml::parse_error& error) {
    const toml::source_position& begin = error.source().begin;
    std::string description(error.description());
    std::replace(description.begin(), description.end(), '\n', ' ');
    return source + ":" + std::to_string(begin.line) + ":" + std::to_string(begin.column) +
           ": invalid TOML: " + description;
  }
}

/// `{ v = VALUE }`: VALUE read as TOML when `v = VALUE` is a document with that one key, else
/// the text itself as a string.
toml::table parse_override_value(const std::string& text) {
  try {
    toml::table parsed = toml::parse(std::string_view("v = " + text));
    if (parsed.size() == 1 && parsed.contains("v")) return parsed;
  } catch (const toml::parse_error&) {
  }
  toml::table fallback;
  fallback.insert("v", text);
  return fallback;
}

/// Applies "section.key=value" to `root`, creating the section when it is missing.
problem apply_override(const std::string& text, toml::table* root,
                       std::set<std::string>* overridden) {
  const size_t equals = text.find('=');
  const std::string key = trim(text.substr(0, equals));
  const size_t dot = key.find('.');
  if (equals == std::string::npos || dot == std::string::npos || dot == 0 ||
      dot + 1 == key.size() || key.find('.', dot + 1) != std::string::npos) {
    return "malformed override '" + text + "': expected section.key=value";
  }
  try {
    (void)nlohmann::json(text).dump();
  } catch (const nlohmann::json::exception&) {
    return "override of '" + key + "' is not valid UTF-8";
  }
  const std::string section = key.substr(0, dot);
  if (!root->contains(section)) root->insert(section, toml::table{});
  toml::table* table = root->get_as<toml::table>(section);
  if (table == nullptr) return wrong_type(section, "a table", *root->get(section));
  toml::table value = parse_override_value(trim(text.substr(equals + 1)));
  table->insert_or_assign(key.substr(dot + 1), std::move(*value.get("v")));
  overridden->insert(key);
  return std::nullopt;
}

std::optional<job_config> fail(job_error* error, std::string message) {
  if (error != nullptr) error->message = std::move(message);
  return std::nullopt;
}

std::optional<job_config> parse_job_or_throw(const std::string& toml_text,
                                             const std::string& source_name,
                                             const std::vector<std::string>& overrides,
                                             job_error* error) {
  toml::table root;
  if (problem message = parse_toml(toml_text, source_name, &root)) return fail(error, *message);
  std::set<std::string> overridden;
  for (const auto& text : overrides) {
    if (problem message = apply_override(text, &root, &overridden)) {
      return fail(error, source_name + ": " + *message);
    }
  }
  job_config config;
  if (problem message = read_job(root, overridden, &config)) {
    return fail(error, source_name + ": " + *message);
  }
  return config;
}

// JSON out -------------------------------------------------------------------------------------

/// The shortest decimal that reads back as `value`, widened: 0.1f gives 0.1, not 0.10000000149.
double widen(float value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::strtod(std::string(buffer, result.ptr).c_str(), nullptr);
}

nlohmann::json layer_json(const layer_spec& spec) {
  nlohmann::json json = {{"type", spec.type}};
  const bool image = spec.type == "conv2d" || spec.type == "maxpool2d";
  if (spec.type == "linear" || spec.type == "conv2d") json["out"] = spec.out;
  if (spec.type == "linear" || spec.type == "conv2d") json["bias"] = spec.bias;
  if (image) json["kernel"] = spec.kernel;
  if (image) json["stride"] = spec.stride;
  if (spec.type == "conv2d") json["padding"] = spec.padding;
  if (spec.type == "dropout") json["p"] = widen(spec.probability);
  return json;
}

nlohmann::json model_json(const model_config& model) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& spec : model.layers) layers.push_back(layer_json(spec));
  return {{"layers", layers}, {"input_shape", model.input_shape}, {"loss", model.loss}};
}

nlohmann::json data_json(const data_config& d) {
  return {{"dataset", d.dataset},
          {"path", d.path},
          {"shuffle", d.shuffle},
          {"normalize", d.normalize},
          {"train_samples", d.train_samples},
          {"test_samples", d.test_samples},
          {"synthetic_train", d.synthetic_train},
          {"synthetic_test", d.synthetic_test},
          {"classes", d.classes}};
}

nlohmann::json parallelism_json(const parallelism_config& p) {
  std::vector<int64_t> cuts;
  const bool has_cuts = parse_cut_points(p.partition, &cuts);
  return {{"stages", p.stages},
          {"partition", has_cuts ? nlohmann::json(cuts) : nlohmann::json(p.partition)},
          {"devices", p.devices},
          {"mode", p.mode},
          {"schedule", p.schedule},
          {"micro_batches", p.micro_batches},
          {"max_active_keys", p.max_active_keys},
          {"min_update_interval", p.min_update_interval},
          {"max_staleness", p.max_staleness},
          {"weight_stashing", p.weight_stashing},
          {"threads", p.threads}};
}

nlohmann::json training_json(const training_config& t) {
  return {{"batch_size", t.batch_size},
          {"epochs", t.epochs},
          {"max_steps", t.max_steps},
          {"optimizer", t.optimizer},
          {"lr", t.lr},
          {"momentum", t.momentum},
          {"weight_decay", t.weight_decay},
          {"beta1", t.beta1},
          {"beta2", t.beta2},
          {"epsilon", t.epsilon},
          {"lr_schedule", t.lr_schedule},
          {"lr_decay", t.lr_decay},
          {"lr_decay_epochs", t.lr_decay_epochs},
          {"warmup_steps", t.warmup_steps},
          {"seed", t.seed},
          {"target_accuracy", t.target_accuracy},
          {"precision", t.precision}};
}

}  // namespace

std::optional<job_config> parse_job(const std::string& toml_text, const std::string& source_name,
                                    const std::vector<std::string>& overrides, job_error* error) {
  try {
    return parse_job_or_throw(toml_text, source_name, overrides, error);
  } catch (const std::exception& exception) {
    return fail(error, source_name + ": " + exception.what());
  }
}

std::optional<job_config> load_job_file(const std::string& path,
                                        const std::vector<std::string>& overrides,
                                        job_error* error) {
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
  return parse_job(text, path, overrides, error);
}

nlohmann::json to_json(const job_config& config) {
  const checkpoint_config& c = config.checkpoint;
  const metrics_config& m = config.metrics;
  return {{"model", model_json(config.model)},
          {"data", data_json(config.data)},
          {"parallelism", parallelism_json(config.parallelism)},
          {"training", training_json(config.training)},
          {"checkpoint",
           {{"dir", c.dir},
            {"interval_steps", c.interval_steps},
            {"interval_s", c.interval_s},
            {"keep_last", c.keep_last}}},
          {"metrics",
           {{"log_interval", m.log_interval}, {"trace", m.trace}, {"progress", m.progress}}}};
}

std::string config_hash(const job_config& config) {
  const std::string text =
      to_json(config).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  uint64_t hash = 14695981039346656037ull;  // FNV-1a 64
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

}  // namespace troupe::actors
