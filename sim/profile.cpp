#include "sim/profile.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "actors/actor_hosting.h"
#include "actors/stage_device.h"
#include "layers/backend_registry.h"
#include "layers/model.h"
#include "transport/endpoint.h"

namespace troupe::sim {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

/// Times forward, backward (with and without the input gradient) and the step of block
/// `index`, repeating until `seconds` have passed (at least three rounds).
block_profile time_block(const actors::job_config& config, size_t index, layers::backend& device,
                         const layers::shape& input, int64_t batch, double seconds) {
  auto stage = actors::make_layers_stage_device(config, {index, index + 1}, device);
  layers::shape dims{batch};
  dims.insert(dims.end(), input.begin(), input.end());
  std::vector<float> values(static_cast<size_t>(layers::element_count(dims)), 0.5f);
  actors::key_message message;
  message.payload = layers::tensor::from_host(device, device.default_stream(), dims, values);
  std::vector<double> forward, backward, first, step;
  const auto start = clock_type::now();
  for (uint64_t round = 0; round < 3 || seconds_since(start) < seconds; ++round) {
    message.key = round;
    message.kind = actors::key_kind::forward;
    auto begin = clock_type::now();
    actors::key_message gradient = message;
    gradient.payload = stage->forward(message, true);
    device.synchronize(device.default_stream());
    forward.push_back(seconds_since(begin));
    gradient.kind = actors::key_kind::backward;
    begin = clock_type::now();
    const bool input_gradient = round % 2 == 0;
    stage->backward(gradient, input_gradient);
    device.synchronize(device.default_stream());
    (input_gradient ? backward : first).push_back(seconds_since(begin));
    begin = clock_type::now();
    stage->step(0.0f);
    device.synchronize(device.default_stream());
    step.push_back(seconds_since(begin));
  }
  block_profile result;
  result.type = config.model.layers[index].type;
  result.forward_s = median(forward);
  result.backward_s = median(backward);
  result.backward_first_s = median(first);
  result.step_s = median(step);
  return result;
}

/// One-way time of a message of `bytes` between two ipc:// endpoints of this process.
double message_seconds(transport::outbox& out, transport::inbox& in, size_t bytes, int rounds) {
  transport::message message;
  message.header.kind = transport::message_kind::forward;
  transport::add_payload(message, {static_cast<int64_t>(bytes / 4)},
                         std::make_shared<const std::vector<float>>(bytes / 4, 1.0f));
  std::vector<double> times;
  for (int r = 0; r < rounds; ++r) {
    const auto begin = clock_type::now();
    if (!out.send_waiting(message, std::chrono::seconds(10)).ok()) return -1;
    auto received = in.receive(std::chrono::seconds(10));
    if (!received || !received->ok()) return -1;
    times.push_back(seconds_since(begin));
  }
  return median(times);
}

bool time_transport(machine_profile* profile, std::string* error) {
  char pattern[] = "/tmp/troupe-calibrate-XXXXXX";
  if (!mkdtemp(pattern)) {
    *error = "cannot create a directory for the ipc:// endpoints";
    return false;
  }
  const std::string address = std::string("ipc://") + pattern + "/link";
  bool ok = false;
  {
    transport::transport_context context;
    transport::endpoint_options options;
    options.receive_high_water_mark = 16;
    transport::endpoint_error problem;
    auto in = transport::inbox::bind(context, address, options, &problem);
    auto out = in ? transport::outbox::connect(context, address, options, &problem) : std::nullopt;
    if (!in || !out) {
      *error = problem.text;
    } else {
      const size_t small = 64, large = size_t{4} << 20;
      const double latency = message_seconds(*out, *in, small, 200);
      const double big = message_seconds(*out, *in, large, 20);
      ok = latency > 0 && big > latency;
      if (ok) {
        profile->link_latency_s = latency;
        profile->link_bandwidth = static_cast<double>(large - small) / (big - latency);
      } else {
        *error = "the ipc:// round of the transport measurement failed";
      }
    }
  }
  std::remove((std::string(pattern) + "/link").c_str());
  rmdir(pattern);
  return ok;
}

}  // namespace

std::optional<machine_profile> calibrate(const actors::job_config& config, double seconds,
                                         std::string* error) {
  auto shapes = layers::infer_shapes(config.model.layers, config.model.input_shape, error);
  if (!shapes) return std::nullopt;
  machine_profile profile;
  profile.backend = actors::device_of_stage(config, 0);
  profile.threads = actors::threads_per_stage(config);
  profile.batch = config.training.batch_size / config.parallelism.micro_batches;
  auto device = layers::create_backend(profile.backend, profile.threads, error);
  if (!device) return std::nullopt;
  layers::shape input = config.model.input_shape;
  for (size_t i = 0; i < config.model.layers.size(); ++i) {
    profile.blocks.push_back(time_block(config, i, *device, input, profile.batch, seconds));
    input = (*shapes)[i];
  }
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
  if (!time_transport(&profile, error)) return std::nullopt;
  return profile;
}

void use_measured_transport(const machine_profile& profile, cluster_model* cluster) {
  for (const std::vector<int>* ports : {&cluster->device_egress, &cluster->device_ingress}) {
    for (int link : *ports) {
      cluster->links[link].latency_s = profile.link_latency_s / 2;
      cluster->links[link].bandwidth = profile.link_bandwidth;
    }
  }
}

std::string to_json_text(const machine_profile& profile) {
  json blocks = json::array();
  for (const block_profile& b : profile.blocks) {
    blocks.push_back({{"type", b.type},
                      {"forward_s", b.forward_s},
                      {"backward_s", b.backward_s},
                      {"backward_first_s", b.backward_first_s},
                      {"step_s", b.step_s}});
  }
  json text = {{"backend", profile.backend},
               {"threads", profile.threads},
               {"batch", profile.batch},
               {"blocks", blocks},
               {"loss_s", profile.loss_s},
               {"link_latency_s", profile.link_latency_s},
               {"link_bandwidth", profile.link_bandwidth}};
  return text.dump(2) + "\n";
}

std::optional<machine_profile> parse_profile(const std::string& text, const std::string& source,
                                             std::string* error) {
  const json root = json::parse(text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    *error = source + ": not a JSON object";
    return std::nullopt;
  }
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
  profile.threads = static_cast<int>(threads);
  profile.batch = static_cast<int64_t>(batch);
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
        !number(entry, "step_s", where, &block.step_s, false)) {
      return std::nullopt;
    }
    profile.blocks.push_back(block);
  }
  return profile;
}

std::optional<machine_profile> load_profile(const std::string& path, std::string* error) {
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
