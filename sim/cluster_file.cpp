// Reading a cluster file (TOML) into a cluster_model, with errors that name the key.

#include "sim/cluster_model.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "actors/config/toml_fields.h"
#include "layers/regular_file.h"

namespace troupe::sim {
namespace {

using actors::detail::kInfinity;
using actors::detail::kNonNegative;
using actors::detail::kPositive;
using actors::detail::number_range;
using actors::detail::problem;

constexpr number_range kEfficiency{0, 1, true, false, "in (0, 1]"};
constexpr number_range kJitter{0, 1, false, false, "in [0, 1]"};
constexpr number_range kAtLeastOne{1, kInfinity, false, false, ">= 1"};
/// Bounds every count, so that a typo such as `count = 1e9` is an error, not an allocation.
constexpr int64_t kMaxDevices = int64_t{1} << 20;

const char* const kLinkExample = "a table such as { latency_s = 2e-6, bandwidth = 4.5e11 }";

/// A device type, and the "gpu" or "cpu" that names its devices.
struct device_type {
  device_model prototype;
  std::string kind = "gpu";
};
using device_types = std::map<std::string, device_type>;  // sorted: messages list them in order

/// One [[nodes]] entry before it is expanded into `count` nodes.
struct node_entry {
  std::string name;
  int64_t count = 1;
  std::string type;
  int64_t devices = 0;
  link_model device_link;
  link_model nic;
};

struct network_options {
  int64_t nodes_per_switch = 0;  ///< 0: every node on one switch
  double oversubscription = 1;
  double switch_latency_s = 0;
};

std::string key_path(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const auto& word : words) text += (text.empty() ? "" : ", ") + word;
  return text;
}

/// "did you mean X?" for a key close to `typed`, else the keys the table may hold.
std::string hint(const std::string& typed, const std::vector<std::string>& known) {
  const std::string text = actors::detail::suggestion(typed, known);  // "; did you mean 'X'?"
  const size_t open = text.find('\'');
  const size_t close = text.rfind('\'');
  if (open == std::string::npos || close <= open) return "known keys: " + joined(known);
  return "did you mean " + text.substr(open + 1, close - open - 1) + "?";
}

problem check_keys(const toml::table& table, const std::string& path,
                   const std::vector<std::string>& known) {
  for (const auto& [key, node] : table) {
    const std::string name(key.str());
    if (std::count(known.begin(), known.end(), name) > 0) continue;
    return key_path(path, name) + ": unknown key (" + hint(name, known) + ")";
  }
  return std::nullopt;
}

// Readers of one key: "PATH.KEY: must be ..., got ..." or "PATH.KEY: missing (...)" -------------

problem number_key(const toml::table& table, const std::string& path, const char* key,
                   const number_range& range, double* out) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return std::nullopt;
  return actors::detail::read_number(*node, key_path(path, key) + ":", range, out);
}

/// Like number_key, with a missing key an error explained by `unit`.
problem required_number(const toml::table& table, const std::string& path, const char* key,
                        const number_range& range, const std::string& unit, double* out) {
  if (table.get(key) == nullptr) {
    return key_path(path, key) + ": missing (" + unit + ", " + range.text + ")";
  }
  return number_key(table, path, key, range, out);
}

problem integer_key(const toml::table& table, const std::string& path, const char* key,
                    int64_t* out) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return std::nullopt;
  return actors::detail::read_integer(*node, key_path(path, key) + ":", 1, kMaxDevices, out);
}

problem string_key(const toml::table& table, const std::string& path, const char* key,
                   const std::vector<std::string>& choices, std::string* out) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return std::nullopt;
  return actors::detail::read_string(*node, key_path(path, key) + ":", choices, out);
}

/// The table at `key`, or null: absent (no error) or something else (`error` set).
const toml::table* table_key(const toml::table& table, const std::string& path, const char* key,
                             const std::string& expected, problem* error) {
  const toml::node* node = table.get(key);
  if (node == nullptr) return nullptr;
  if (node->is_table()) return node->as_table();
  *error = actors::detail::wrong_type(key_path(path, key) + ":", expected, *node);
  return nullptr;
}

// [device_types] ---------------------------------------------------------------------------------

problem read_device_type(const toml::table& table, const std::string& path, device_type* out) {
  device_model& d = out->prototype;
  if (problem error = check_keys(
          table, path,
          {"kind", "peak_flops", "memory_bandwidth", "memory_bytes", "launch_overhead_s",
           "efficiency", "pooled", "time_sliced", "time_slice_efficiency", "work_jitter"})) {
    return error;
  }
  if (problem error = string_key(table, path, "kind", {"gpu", "cpu"}, &out->kind)) return error;
  if (const toml::node* pooled = table.get("pooled")) {
    if (problem error =
            actors::detail::read_bool(*pooled, key_path(path, "pooled") + ":", &d.pooled)) {
      return error;
    }
  }
  if (const toml::node* sliced = table.get("time_sliced")) {
    const std::string key = key_path(path, "time_sliced");
    if (problem error = actors::detail::read_bool(*sliced, key + ":", &d.time_sliced)) {
      return error;
    }
    if (d.time_sliced && !d.pooled) return key + ": needs pooled = true (a pool to share)";
  }
  const struct {
    const char* key;
    number_range range;
    const char* unit;  ///< null: the key is optional
    double* out;
  } numbers[] = {{"peak_flops", kPositive, "FLOP/s", &d.peak_flops},
                 {"memory_bandwidth", kPositive, "bytes/s", &d.memory_bandwidth},
                 {"memory_bytes", kPositive, "bytes", &d.memory_bytes},
                 {"launch_overhead_s", kNonNegative, nullptr, &d.launch_overhead_s},
                 {"efficiency", kEfficiency, nullptr, &d.efficiency},
                 {"time_slice_efficiency", kEfficiency, nullptr, &d.time_slice_efficiency},
                 {"work_jitter", kJitter, nullptr, &d.work_jitter}};
  for (const auto& number : numbers) {
    problem error =
        number.unit == nullptr
            ? number_key(table, path, number.key, number.range, number.out)
            : required_number(table, path, number.key, number.range, number.unit, number.out);
    if (error) return error;
  }
  if (table.get("time_slice_efficiency") && !d.time_sliced) {
    return key_path(path, "time_slice_efficiency") + ": needs time_sliced = true";
  }
  return std::nullopt;
}

problem read_device_types(const toml::table& root, device_types* out) {
  problem error;
  const toml::table* table =
      table_key(root, "", "device_types", "a table of [device_types.NAME]", &error);
  if (error) return error;
  if (table == nullptr || table->empty()) {
    return "device_types: missing (one or more [device_types.NAME] tables)";
  }
  for (const auto& [key, node] : *table) {
    const std::string name(key.str());
    const std::string path = "device_types." + name;
    if (!node.is_table()) return actors::detail::wrong_type(path + ":", "a table", node);
    device_type& type = (*out)[name];
    type.prototype.type = name;
    if (problem failed = read_device_type(*node.as_table(), path, &type)) return failed;
  }
  return std::nullopt;
}

// [[nodes]] --------------------------------------------------------------------------------------

problem read_link(const toml::table& table, const std::string& path, const char* key,
                  link_model* out) {
  problem error;
  const toml::table* link = table_key(table, path, key, kLinkExample, &error);
  if (error) return error;
  const std::string link_path = key_path(path, key);
  if (link == nullptr) return link_path + ": missing (" + kLinkExample + ")";
  if (problem failed = check_keys(*link, link_path, {"latency_s", "bandwidth"})) return failed;
  if (problem failed = number_key(*link, link_path, "latency_s", kNonNegative, &out->latency_s)) {
    return failed;
  }
  return required_number(*link, link_path, "bandwidth", kPositive, "bytes/s", &out->bandwidth);
}

problem read_node_type(const toml::table& table, const std::string& path, const device_types& types,
                       std::string* out) {
  std::vector<std::string> names;
  for (const auto& [name, type] : types) names.push_back(name);
  if (table.get("device_type") == nullptr) {
    return path + ".device_type: missing (one of: " + joined(names) + ")";
  }
  if (problem error = string_key(table, path, "device_type", {}, out)) return error;
  if (types.count(*out) > 0) return std::nullopt;
  return path + ".device_type: no device type named \"" + *out + "\" (have: " + joined(names) + ")";
}

problem read_node_entry(const toml::node& node, const std::string& path, const device_types& types,
                        node_entry* out) {
  const toml::table* table = node.as_table();
  if (table == nullptr) return actors::detail::wrong_type(path + ":", "a table", node);
  if (problem error = check_keys(
          *table, path, {"name", "count", "device_type", "devices", "device_link", "nic"})) {
    return error;
  }
  if (table->get("name") == nullptr) return path + ".name: missing (a string such as \"node\")";
  problem error = string_key(*table, path, "name", {}, &out->name);
  if (!error && (out->name.empty() || out->name.find('/') != std::string::npos)) {
    error = path + ".name: must be a non-empty name without '/', got \"" + out->name + "\"";
  }
  if (!error) error = integer_key(*table, path, "count", &out->count);
  if (!error) error = read_node_type(*table, path, types, &out->type);
  if (!error && table->get("devices") == nullptr) {
    error = path + ".devices: missing (devices per node, >= 1)";
  }
  if (!error) error = integer_key(*table, path, "devices", &out->devices);
  if (!error) error = read_link(*table, path, "device_link", &out->device_link);
  if (!error) error = read_link(*table, path, "nic", &out->nic);
  return error;
}

int add_link(cluster_model* cluster, std::string name, const link_model& like) {
  cluster->links.push_back({std::move(name), like.latency_s, like.bandwidth});
  return static_cast<int>(cluster->links.size()) - 1;
}

/// Appends one node of `entry`, its devices and their links.
void add_node(const node_entry& entry, const std::string& name, const device_type& type,
              cluster_model* cluster) {
  node_model node;
  node.name = name;
  for (int64_t i = 0; i < entry.devices; ++i) {
    device_model device = type.prototype;
    device.name = name + "/" + type.kind + std::to_string(i);
    device.node = static_cast<int>(cluster->nodes.size());
    node.devices.push_back(static_cast<int>(cluster->devices.size()));
    cluster->device_egress.push_back(add_link(cluster, device.name + " egress", entry.device_link));
    cluster->device_ingress.push_back(
        add_link(cluster, device.name + " ingress", entry.device_link));
    cluster->devices.push_back(std::move(device));
  }
  node.nic_egress = add_link(cluster, name + " nic egress", entry.nic);
  node.nic_ingress = add_link(cluster, name + " nic ingress", entry.nic);
  cluster->nodes.push_back(std::move(node));
}

problem read_nodes(const toml::table& root, const device_types& types, cluster_model* cluster) {
  const toml::node* nodes = root.get("nodes");
  if (nodes == nullptr) return "nodes: missing (one or more [[nodes]] tables)";
  const toml::array* array = nodes->as_array();
  if (array == nullptr) {
    return actors::detail::wrong_type("nodes:", "an array of [[nodes]]", *nodes);
  }
  if (array->empty()) return "nodes: must not be empty";
  std::map<std::string, std::string> defined_by;  // node name -> "nodes[i]"
  for (size_t i = 0; i < array->size(); ++i) {
    const std::string path = "nodes[" + std::to_string(i) + "]";
    node_entry entry;
    if (problem error = read_node_entry(*array->get(i), path, types, &entry)) return error;
    const int64_t total =
        static_cast<int64_t>(cluster->devices.size()) + entry.count * entry.devices;
    if (total > kMaxDevices) {
      return path + ": makes " + std::to_string(total) + " devices in all, more than " +
             std::to_string(kMaxDevices);
    }
    for (int64_t n = 0; n < entry.count; ++n) {
      const std::string name = entry.count == 1 ? entry.name : entry.name + std::to_string(n);
      const auto [it, added] = defined_by.emplace(name, path);
      if (!added) {
        return path + ".name: node \"" + name + "\" already exists (from " + it->second + ")";
      }
      add_node(entry, name, types.at(entry.type), cluster);
    }
  }
  return std::nullopt;
}

// [network] and [placement] ----------------------------------------------------------------------

problem read_network(const toml::table& root, network_options* out) {
  problem error;
  const toml::table* table = table_key(root, "", "network", "a table", &error);
  if (error || table == nullptr) return error;
  error =
      check_keys(*table, "network", {"nodes_per_switch", "oversubscription", "switch_latency_s"});
  if (!error) error = integer_key(*table, "network", "nodes_per_switch", &out->nodes_per_switch);
  if (!error) {
    error = number_key(*table, "network", "oversubscription", kAtLeastOne, &out->oversubscription);
  }
  if (!error) {
    error = number_key(*table, "network", "switch_latency_s", kNonNegative, &out->switch_latency_s);
  }
  return error;
}

problem read_storage(const toml::table& root, cluster_model* cluster) {
  problem error;
  const toml::table* table = table_key(root, "", "storage", "a table", &error);
  if (error || table == nullptr) return error;
  error = check_keys(*table, "storage", {"bandwidth", "latency_s"});
  if (!error) {
    error = required_number(*table, "storage", "bandwidth", kPositive, "bytes/s",
                            &cluster->storage_bandwidth);
  }
  if (!error) {
    error = number_key(*table, "storage", "latency_s", kNonNegative, &cluster->storage_latency_s);
  }
  return error;
}

/// Assigns nodes to leaf switches; with more than one switch, adds each one's uplink and
/// downlink to the spine.
void add_switches(const network_options& network, cluster_model* cluster) {
  const int64_t nodes = static_cast<int64_t>(cluster->nodes.size());
  const int64_t per_switch = network.nodes_per_switch > 0 ? network.nodes_per_switch : nodes;
  const int64_t switches = (nodes + per_switch - 1) / per_switch;
  cluster->switch_latency_s = network.switch_latency_s;
  for (int64_t n = 0; n < nodes; ++n) {
    cluster->nodes[n].switch_index = static_cast<int>(n / per_switch);
  }
  if (switches < 2) return;
  for (int64_t s = 0; s < switches; ++s) {
    const int64_t first = s * per_switch;
    const int64_t last = std::min(nodes, first + per_switch);
    double nic_bandwidth = 0;
    for (int64_t n = first; n < last; ++n) {
      nic_bandwidth += cluster->links[cluster->nodes[n].nic_egress].bandwidth;
    }
    // Latency 0: a switch's latency is counted once per switch passed (path_latency_s).
    const link_model spine{"", 0,
                           static_cast<double>(per_switch) * (nic_bandwidth / (last - first)) /
                               network.oversubscription};
    const std::string name = "switch" + std::to_string(s);
    cluster->switch_uplink.push_back(add_link(cluster, name + " uplink", spine));
    cluster->switch_downlink.push_back(add_link(cluster, name + " downlink", spine));
  }
}

/// "(devices node0/gpu0 ... node15/gpu3)"
std::string device_range(const cluster_model& cluster) {
  const std::string& first = cluster.devices.front().name;
  if (cluster.devices.size() == 1) return "(device " + first + ")";
  return "(devices " + first + " ... " + cluster.devices.back().name + ")";
}

problem read_placement(const toml::table& root, cluster_model* cluster) {
  problem error;
  const toml::table* table = table_key(root, "", "placement", "a table", &error);
  if (error || table == nullptr) return error;
  if (problem failed = check_keys(*table, "placement", {"stages"})) return failed;
  const toml::node* stages = table->get("stages");
  if (stages == nullptr) {
    return "placement.stages: missing (an array of device names, one per stage)";
  }
  const toml::array* names = stages->as_array();
  if (names == nullptr) {
    return actors::detail::wrong_type("placement.stages:", "an array of device names", *stages);
  }
  if (names->empty()) return "placement.stages: must not be empty (one device name per stage)";
  std::map<std::string, int> index;
  for (size_t d = 0; d < cluster->devices.size(); ++d) {
    index.emplace(cluster->devices[d].name, static_cast<int>(d));
  }
  for (size_t s = 0; s < names->size(); ++s) {
    const std::string label = "placement.stages[" + std::to_string(s) + "]";
    std::string name;
    if (problem failed = actors::detail::read_string(*names->get(s), label + ":", {}, &name)) {
      return failed;
    }
    const auto found = index.find(name);
    if (found == index.end()) {
      return label + ": no device named \"" + name + "\" " + device_range(*cluster);
    }
    cluster->placement.push_back(found->second);
  }
  return std::nullopt;
}

problem read_cluster(const toml::table& root, const std::string& source, cluster_model* cluster) {
  if (problem error = check_keys(
          root, "", {"name", "device_types", "nodes", "network", "storage", "placement"})) {
    return error;
  }
  cluster->name = std::filesystem::path(source).stem().string();
  if (problem error = string_key(root, "", "name", {}, &cluster->name)) return error;
  device_types types;
  if (problem error = read_device_types(root, &types)) return error;
  if (problem error = read_nodes(root, types, cluster)) return error;
  network_options network;
  if (problem error = read_network(root, &network)) return error;
  add_switches(network, cluster);
  if (problem error = read_storage(root, cluster)) return error;
  return read_placement(root, cluster);
}

std::optional<cluster_model> fail(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return std::nullopt;
}

}  // namespace

std::optional<cluster_model> parse_cluster(const std::string& text, const std::string& source,
                                           std::string* error) {
  try {
    toml::table root;
    if (problem message = actors::detail::parse_toml(text, source, &root)) {
      return fail(error, *message);
    }
    cluster_model cluster;
    if (problem message = read_cluster(root, source, &cluster)) {
      return fail(error, source + ": " + *message);
    }
    return cluster;
  } catch (const std::exception& exception) {
    return fail(error, source + ": " + exception.what());
  }
}

std::optional<cluster_model> load_cluster_file(const std::string& path, std::string* error) {
  const std::string not_regular = layers::regular_file_problem(path);
  if (!not_regular.empty()) return fail(error, not_regular + " (the cluster file)");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (file == nullptr) {
    return fail(error, path + ": cannot open cluster file: " + std::strerror(errno));
  }
  std::string text;
  char buffer[1 << 14];
  size_t count = 0;
  while ((count = std::fread(buffer, 1, sizeof buffer, file.get())) > 0) text.append(buffer, count);
  if (std::ferror(file.get())) {
    return fail(error, path + ": cannot read cluster file: " + std::strerror(errno));
  }
  return parse_cluster(text, path, error);
}

}  // namespace troupe::sim
