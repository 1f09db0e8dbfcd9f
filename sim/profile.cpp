#include "sim/profile.h"

#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "actors/config/json_text.h"
#include "layers/regular_file.h"

namespace troupe::sim {
namespace {

using json = nlohmann::json;

json node_json(const node_profile& node) {
  return {{"name", node.name},
          {"rows", node.rows},
          {"forward_s", node.forward_s},
          {"backward_s", node.backward_s},
          {"backward_first_s", node.backward_first_s},
          {"evaluation_rows", node.evaluation_rows},
          {"evaluate_s", node.evaluate_s},
          {"step_s", node.step_s},
          {"stash_s", node.stash_s},
          {"predict_s", node.predict_s}};
}

/// `entry`[key] as a list of `count` numbers >= 0 (any count when `count` is 0); false with
/// `error` naming the field.
template <class number_type>
bool number_list(const json& entry, const std::string& key, const std::string& where, size_t count,
                 std::vector<number_type>* out, std::string* error) {
  const auto& list = entry.find(key);
  bool good = list != entry.end() && list->is_array() && (count == 0 || list->size() == count);
  for (size_t i = 0; good && i < list->size(); ++i) {
    good = (*list)[i].is_number() && (*list)[i].get<double>() >= 0;
    if (good) out->push_back((*list)[i].get<number_type>());
  }
  if (!good) {
    *error = where + key + ": missing, or not a list of numbers >= 0" +
             (count > 0 ? " (" + std::to_string(count) + " of them, one per row count)" : "");
  }
  return good;
}

/// `entry`[key] as increasing row counts >= 1, at least one; false with `error` naming it.
bool row_counts(const json& entry, const std::string& key, const std::string& where,
                std::vector<int64_t>* rows, std::string* error) {
  if (!number_list(entry, key, where, 0, rows, error)) return false;
  for (size_t i = 0; i < rows->size(); ++i) {
    if ((*rows)[i] < 1 || (i > 0 && (*rows)[i] <= (*rows)[i - 1])) {
      *error = where + key + ": must be increasing row counts >= 1";
      return false;
    }
  }
  if (rows->empty()) *error = where + key + ": empty";
  return !rows->empty();
}

/// The node profile `entry` of a profile's `nodes`; nothing, with `error` naming its field.
std::optional<node_profile> parse_node(const json& entry, const std::string& where,
                                       std::string* error) {
  node_profile node;
  if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string()) {
    *error = where + "name: missing";
    return std::nullopt;
  }
  node.name = entry["name"].get<std::string>();
  if (!row_counts(entry, "rows", where, &node.rows, error)) return std::nullopt;
  const size_t count = node.rows.size();
  // An empty list (as written for a profile without them) means `rows`.
  const bool evaluation_rows =
      entry.contains("evaluation_rows") &&
      !(entry["evaluation_rows"].is_array() && entry["evaluation_rows"].empty());
  if (evaluation_rows &&
      !row_counts(entry, "evaluation_rows", where, &node.evaluation_rows, error)) {
    return std::nullopt;
  }
  const size_t evaluations = node.evaluation_rows.empty() ? count : node.evaluation_rows.size();
  if (!number_list(entry, "forward_s", where, count, &node.forward_s, error) ||
      !number_list(entry, "backward_s", where, count, &node.backward_s, error) ||
      !number_list(entry, "backward_first_s", where, count, &node.backward_first_s, error) ||
      !number_list(entry, "evaluate_s", where, evaluations, &node.evaluate_s, error)) {
    return std::nullopt;
  }
  for (const auto& [key, field] :
       {std::pair{"step_s", &node.step_s}, std::pair{"stash_s", &node.stash_s},
        std::pair{"predict_s", &node.predict_s}}) {
    if (!entry.contains(key) || !entry[key].is_number() || entry[key].get<double>() < 0) {
      *error = where + key + ": missing or not a number >= 0";
      return std::nullopt;
    }
    *field = entry[key].get<double>();
  }
  return node;
}

}  // namespace

void use_measured_transport(const machine_profile& profile, cluster_model* cluster,
                            bool in_process) {
  const double latency_s = in_process && profile.inproc_latency_s > 0 ? profile.inproc_latency_s
                                                                      : profile.link_latency_s;
  for (const std::vector<int>* ports : {&cluster->device_egress, &cluster->device_ingress}) {
    for (int link : *ports) {
      cluster->links[link].latency_s = latency_s / 2;
      cluster->links[link].bandwidth = profile.link_bandwidth;
    }
  }
  for (device_model& device : cluster->devices) {
    if (device.work_jitter == 0) device.work_jitter = profile.work_jitter;
  }
  if (in_process) return;
  for (device_model& device : cluster->devices) {
    if (device.time_sliced) device.time_slice_efficiency = profile.time_slice_efficiency;
  }
}

std::string to_json_text(const machine_profile& profile) {
  json blocks = json::array();
  for (const block_profile& b : profile.blocks) {
    blocks.push_back({{"type", b.type},
                      {"forward_s", b.forward_s},
                      {"backward_s", b.backward_s},
                      {"backward_first_s", b.backward_first_s},
                      {"step_s", b.step_s},
                      {"stash_s", b.stash_s},
                      {"predict_s", b.predict_s},
                      {"evaluate_s", b.evaluate_s}});
  }
  json nodes = json::array();
  for (const node_profile& node : profile.nodes) nodes.push_back(node_json(node));
  json text = {{"backend", profile.backend},
               {"threads", profile.threads},
               {"batch", profile.batch},
               {"evaluation_batch", profile.evaluation_batch},
               {"blocks", blocks},
               {"loss_s", profile.loss_s},
               {"loss_rows", profile.loss_rows},
               {"link_latency_s", profile.link_latency_s},
               {"link_bandwidth", profile.link_bandwidth},
               {"inproc_message_cpu_s", profile.inproc_message_cpu_s},
               {"ipc_message_cpu_s", profile.ipc_message_cpu_s},
               {"inproc_message_cpu_per_byte_s", profile.inproc_message_cpu_per_byte_s},
               {"ipc_message_cpu_per_byte_s", profile.ipc_message_cpu_per_byte_s},
               {"inproc_latency_s", profile.inproc_latency_s},
               {"time_slice_efficiency", profile.time_slice_efficiency},
               {"parameter_copy_s_per_float", profile.parameter_copy_s_per_float},
               {"coordinator_s_per_sample", profile.coordinator_s_per_sample},
               {"work_jitter", profile.work_jitter}};
  if (!profile.nodes.empty()) text["nodes"] = nodes;
  return text.dump(2) + "\n";
}

std::optional<machine_profile> parse_profile(const std::string& text, const std::string& source,
                                             std::string* error) {
  std::string problem;
  const std::optional<json> parsed = actors::parse_json_text(text, &problem);
  if (!parsed || !parsed->is_object()) {
    *error = source + ": " + (parsed ? "not a JSON object" : problem);
    return std::nullopt;
  }
  const json& root = *parsed;
  machine_profile profile;
  auto number = [&](const json& object, const std::string& key, const std::string& where,
                    double* out, bool positive) {
    if (!object.contains(key) || !object[key].is_number()) {
      *error = source + ": " + where + key + ": missing or not a number";
      return false;
    }
    *out = object[key].get<double>();
    if (*out < 0 || (positive && *out <= 0)) {
      *error = source + ": " + where + key + ": must be " + (positive ? "> 0" : ">= 0");
      return false;
    }
    return true;
  };
  double threads = 0, batch = 0;
  if (!number(root, "threads", "", &threads, true) || !number(root, "batch", "", &batch, true) ||
      !number(root, "loss_s", "", &profile.loss_s, false) ||
      !number(root, "link_latency_s", "", &profile.link_latency_s, false) ||
      !number(root, "link_bandwidth", "", &profile.link_bandwidth, true)) {
    return std::nullopt;
  }
  const std::pair<const char*, double*> optional[] = {
      {"inproc_message_cpu_s", &profile.inproc_message_cpu_s},
      {"ipc_message_cpu_s", &profile.ipc_message_cpu_s},
      {"inproc_message_cpu_per_byte_s", &profile.inproc_message_cpu_per_byte_s},
      {"ipc_message_cpu_per_byte_s", &profile.ipc_message_cpu_per_byte_s},
      {"inproc_latency_s", &profile.inproc_latency_s},
      {"parameter_copy_s_per_float", &profile.parameter_copy_s_per_float},
      {"coordinator_s_per_sample", &profile.coordinator_s_per_sample}};
  double loss_rows = 0;
  if (root.contains("loss_rows") && !number(root, "loss_rows", "", &loss_rows, false)) {
    return std::nullopt;
  }
  profile.loss_rows = static_cast<int64_t>(loss_rows);
  for (const auto& [key, field] : optional) {
    if (root.contains(key) && !number(root, key, "", field, false)) return std::nullopt;
  }
  if (root.contains("work_jitter")) {
    if (!number(root, "work_jitter", "", &profile.work_jitter, false)) return std::nullopt;
    if (profile.work_jitter > 1) {
      *error = source + ": work_jitter: must be <= 1";
      return std::nullopt;
    }
  }
  if (root.contains("time_slice_efficiency")) {
    double& efficiency = profile.time_slice_efficiency;
    if (!number(root, "time_slice_efficiency", "", &efficiency, true)) return std::nullopt;
    if (efficiency > 1) {
      *error = source + ": time_slice_efficiency: must be <= 1";
      return std::nullopt;
    }
  }
  double evaluation_batch = 0;
  if (root.contains("evaluation_batch") &&
      !number(root, "evaluation_batch", "", &evaluation_batch, false)) {
    return std::nullopt;
  }
  profile.threads = static_cast<int>(threads);
  profile.batch = static_cast<int64_t>(batch);
  profile.evaluation_batch = static_cast<int64_t>(evaluation_batch);
  profile.backend = root.value("backend", "cpu");
  if (!root.contains("blocks") || !root["blocks"].is_array()) {
    *error = source + ": blocks: missing or not a list";
    return std::nullopt;
  }
  for (size_t i = 0; i < root["blocks"].size(); ++i) {
    const json& entry = root["blocks"][i];
    const std::string where = "blocks[" + std::to_string(i) + "].";
    block_profile block;
    if (!entry.is_object() || !entry.contains("type") || !entry["type"].is_string()) {
      *error = source + ": " + where + "type: missing";
      return std::nullopt;
    }
    block.type = entry["type"].get<std::string>();
    if (!number(entry, "forward_s", where, &block.forward_s, false) ||
        !number(entry, "backward_s", where, &block.backward_s, false) ||
        !number(entry, "backward_first_s", where, &block.backward_first_s, false) ||
        !number(entry, "step_s", where, &block.step_s, false) ||
        (entry.contains("stash_s") && !number(entry, "stash_s", where, &block.stash_s, false)) ||
        (entry.contains("predict_s") &&
         !number(entry, "predict_s", where, &block.predict_s, false)) ||
        (entry.contains("evaluate_s") &&
         !number(entry, "evaluate_s", where, &block.evaluate_s, false))) {
      return std::nullopt;
    }
    profile.blocks.push_back(block);
  }
  if (root.contains("nodes")) {
    if (!root["nodes"].is_array()) {
      *error = source + ": nodes: not a list";
      return std::nullopt;
    }
    for (size_t i = 0; i < root["nodes"].size(); ++i) {
      auto node = parse_node(root["nodes"][i], "nodes[" + std::to_string(i) + "].", error);
      if (!node) {
        *error = source + ": " + *error;
        return std::nullopt;
      }
      profile.nodes.push_back(std::move(*node));
    }
  }
  return profile;
}

std::optional<machine_profile> load_profile(const std::string& path, std::string* error) {
  const std::string not_regular = layers::regular_file_problem(path);
  if (!not_regular.empty()) {
    *error = not_regular + " (the profile)";
    return std::nullopt;
  }
  std::ifstream file(path);
  if (!file) {
    *error = path + ": cannot open the profile";
    return std::nullopt;
  }
  std::stringstream text;
  text << file.rdbuf();
  return parse_profile(text.str(), path, error);
}

}  // namespace troupe::sim
