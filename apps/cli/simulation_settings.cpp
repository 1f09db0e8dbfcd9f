#include "apps/cli/simulation_settings.h"

#include <sstream>

#include "sim/profile.h"

namespace troupe::apps {
namespace {

int device_named(const sim::cluster_model& cluster, const std::string& name) {
  for (size_t d = 0; d < cluster.devices.size(); ++d) {
    if (cluster.devices[d].name == name) return static_cast<int>(d);
  }
  return -1;
}

int link_named(const sim::cluster_model& cluster, const std::string& name) {
  for (size_t l = 0; l < cluster.links.size(); ++l) {
    if (cluster.links[l].name == name) return static_cast<int>(l);
  }
  return -1;
}

bool parse_number(const std::string& text, double* value) {
  std::istringstream in(text);
  return static_cast<bool>(in >> *value) && in.eof();
}

/// "DEVICE=SLOWDOWN" or "DEVICE=SLOWDOWN@PROBABILITY".
bool parse_straggler(const std::string& text, const sim::cluster_model& cluster,
                     sim::straggler* out, std::string* error) {
  const size_t equals = text.rfind('=');
  const size_t at = text.find('@', equals == std::string::npos ? 0 : equals);
  *error = "--straggler " + text + ": ";
  if (equals == std::string::npos) {
    *error += "expected DEVICE=SLOWDOWN[@PROBABILITY]";
    return false;
  }
  out->device = device_named(cluster, text.substr(0, equals));
  if (out->device < 0) {
    *error += "no device named " + text.substr(0, equals) + " in the cluster";
    return false;
  }
  const std::string slowdown =
      text.substr(equals + 1, at == std::string::npos ? at : at - equals - 1);
  if (!parse_number(slowdown, &out->slowdown) || out->slowdown < 1) {
    *error += "the slowdown must be a number >= 1";
    return false;
  }
  out->probability = 1;
  if (at != std::string::npos && (!parse_number(text.substr(at + 1), &out->probability) ||
                                  out->probability <= 0 || out->probability > 1)) {
    *error += "the probability must be in (0, 1]";
    return false;
  }
  return true;
}

/// "LINK=FACTOR@START-END" (seconds of virtual time).
bool parse_degradation(const std::string& text, const sim::cluster_model& cluster,
                       sim::link_degradation* out, std::string* error) {
  const size_t equals = text.rfind('=');
  const size_t at = text.find('@', equals == std::string::npos ? 0 : equals);
  const size_t dash = text.find('-', at == std::string::npos ? 0 : at);
  *error = "--degrade " + text + ": ";
  if (equals == std::string::npos || at == std::string::npos || dash == std::string::npos) {
    *error += "expected LINK=FACTOR@START-END";
    return false;
  }
  out->link = link_named(cluster, text.substr(0, equals));
  if (out->link < 0) {
    *error += "no link named \"" + text.substr(0, equals) + "\" in the cluster";
    return false;
  }
  if (!parse_number(text.substr(equals + 1, at - equals - 1), &out->factor) || out->factor <= 0 ||
      !parse_number(text.substr(at + 1, dash - at - 1), &out->start_s) ||
      !parse_number(text.substr(dash + 1), &out->end_s) || out->start_s < 0 ||
      out->end_s <= out->start_s) {
    *error += "FACTOR must be > 0 and 0 <= START < END";
    return false;
  }
  return true;
}

/// "DEVICE@SECONDS" (virtual time).
bool parse_failure(const std::string& text, const sim::cluster_model& cluster,
                   sim::worker_failure* out, std::string* error) {
  const size_t at = text.rfind('@');
  *error = "--fail " + text + ": ";
  if (at == std::string::npos) {
    *error += "expected DEVICE@SECONDS";
    return false;
  }
  out->device = device_named(cluster, text.substr(0, at));
  if (out->device < 0) {
    *error += "no device named \"" + text.substr(0, at) + "\" in the cluster";
    return false;
  }
  if (!parse_number(text.substr(at + 1), &out->at_s) || !(out->at_s >= 0)) {
    *error += "SECONDS must be a number >= 0";
    return false;
  }
  return true;
}

}  // namespace

std::optional<sim::simulation_options> simulation_settings(const simulate_options& options,
                                                           sim::cluster_model* cluster,
                                                           std::string* error) {
  sim::simulation_options settings;
  if (!options.profile_file.empty()) {
    settings.profile = sim::load_profile(options.profile_file, error);
    if (!settings.profile) return std::nullopt;
    sim::use_measured_transport(*settings.profile, cluster, /*in_process=*/true);
    settings.message_cpu_s = settings.profile->inproc_message_cpu_s;  // stages of one process
    settings.message_cpu_per_byte_s = settings.profile->inproc_message_cpu_per_byte_s;
  }
  settings.numerics = options.numerics;
  settings.seed = options.seed;
  for (const std::string& text : options.stragglers) {
    settings.stragglers.emplace_back();
    if (!parse_straggler(text, *cluster, &settings.stragglers.back(), error)) return std::nullopt;
  }
  for (const std::string& text : options.degradations) {
    settings.degradations.emplace_back();
    if (!parse_degradation(text, *cluster, &settings.degradations.back(), error)) {
      return std::nullopt;
    }
  }
  for (const std::string& text : options.failures) {
    settings.failures.emplace_back();
    if (!parse_failure(text, *cluster, &settings.failures.back(), error)) return std::nullopt;
  }
  settings.detection_s = options.heartbeat_timeout_s;
  settings.restart_s = options.restart_s;
  return settings;
}

}  // namespace troupe::apps
