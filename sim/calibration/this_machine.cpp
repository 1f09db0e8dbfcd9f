#include "sim/calibration/this_machine.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include "layers/model.h"
#include "sim/simulation.h"

namespace troupe::sim {
namespace {

constexpr double lowest_efficiency = 0.05;
/// Keys each fitting simulation trains past the pipeline's fill (and as many before them).
constexpr int64_t fitted_keys = 100;
/// Bisection steps: the share to within 1e-4.
constexpr int fitting_rounds = 14;
/// A pipeline that the simulator runs at least this share of its full-share rate even at the
/// lowest share keeps no more stages busy than there are cores: its rate says nothing about
/// the share.
constexpr double insensitive_rate_share = 0.9;

/// The simulated run's training seconds: its samples over its samples per second.
std::optional<double> training_seconds(const actors::job_config& config,
                                       const actors::job_data& data, const cluster_model& cluster,
                                       const simulation_options& settings, std::string* error) {
  actors::quiet_observer quiet;
  auto result = simulate(config, data, cluster, settings, quiet, error);
  if (!result) return std::nullopt;
  const double samples = static_cast<double>(result->summary.steps * config.training.batch_size);
  if (result->summary.samples_per_s <= 0) {
    *error = "the simulation trained no samples";
    return std::nullopt;
  }
  return samples / result->summary.samples_per_s;
}

}  // namespace

std::optional<cluster_model> this_machine(const machine_profile& profile, bool in_process,
                                          std::string* error) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::ostringstream text;
  text << "[device_types.core]\nkind = \"cpu\"\npooled = true\ntime_sliced = "
       << (in_process ? "false" : "true")
       << "\npeak_flops = 1e11\n"
          "memory_bandwidth = 3e10\n"
          "memory_bytes = 8e9\n[[nodes]]\nname = \"this-machine\"\ndevice_type = \"core\"\n"
       << "devices = " << cores
       << "\ndevice_link = { bandwidth = 1e10 }\nnic = { bandwidth = 1e10 }\n";
  auto cluster = parse_cluster(text.str(), "this machine", error);
  if (cluster) use_measured_transport(profile, &*cluster, in_process);
  return cluster;
}

std::optional<double> fit_time_slice_efficiency(const actors::job_config& config,
                                                const machine_profile& profile, double keys_per_s,
                                                std::string* error) {
  auto shapes = layers::infer_shapes(config.model.layers, config.model.input_shape, error);
  if (!shapes) return std::nullopt;
  // The steps of `fitted_keys` keys, run twice over: the second half's keys over the time they
  // add is the rate with the pipeline full (its fill and its drain cancel).
  const int64_t keys_per_step = config.parallelism.micro_batches;
  const int64_t steps = std::max<int64_t>(1, (fitted_keys + keys_per_step - 1) / keys_per_step);
  actors::job_config fitting = config;
  fitting.training.epochs = 1;
  fitting.checkpoint.interval_steps = 0;
  fitting.checkpoint.interval_s = 0;
  fitting.metrics.log_interval = 0;
  fitting.metrics.trace = false;
  // Timing only: the samples' values are never looked at, only copied into keys.
  actors::job_data data;
  for (auto [set, count] : {std::pair{&data.train, 2 * steps * config.training.batch_size},
                            std::pair{&data.test, config.training.batch_size}}) {
    set->sample_shape = config.model.input_shape;
    set->classes = static_cast<int>(layers::element_count(shapes->back()));
    set->features.assign(static_cast<size_t>(count * set->sample_size()), 0.0f);
    set->labels.assign(static_cast<size_t>(count), 0);
  }
  const auto simulated_keys_per_s = [&](double efficiency) -> std::optional<double> {
    machine_profile trial = profile;
    trial.time_slice_efficiency = efficiency;
    // The stand-in's stages spin for exactly their times: simulated with the real work's
    // spread, the pipeline would be slowed by what the stand-in never had, and the share fitted
    // to make up for it would carry the spread into every prediction a second time.
    trial.work_jitter = 0;
    auto cluster = this_machine(trial, /*in_process=*/false, error);
    if (!cluster) return std::nullopt;
    simulation_options settings;
    settings.trace_spans = 0;
    settings.profile = trial;
    settings.message_cpu_s = trial.ipc_message_cpu_s;
    settings.message_cpu_per_byte_s = trial.ipc_message_cpu_per_byte_s;
    double seconds[2] = {0, 0};
    for (int half = 0; half < 2; ++half) {
      fitting.training.max_steps = (half + 1) * steps;
      auto trained = training_seconds(fitting, data, *cluster, settings, error);
      if (!trained) return std::nullopt;
      seconds[half] = *trained;
    }
    if (seconds[1] <= seconds[0]) {
      *error = "the simulated pipeline took no time for its keys";
      return std::nullopt;
    }
    return static_cast<double>(steps * keys_per_step) / (seconds[1] - seconds[0]);
  };
  auto fastest = simulated_keys_per_s(1.0);
  if (!fastest) return std::nullopt;
  if (*fastest <= keys_per_s) return 1.0;
  auto slowest = simulated_keys_per_s(lowest_efficiency);
  if (!slowest) return std::nullopt;
  // Where the share hardly matters to this pipeline, its rate says nothing about time slicing
  // (a loss is another cost), and a share fitted from it would misprice other jobs: keep 1.
  if (*slowest >= insensitive_rate_share * *fastest) return 1.0;
  if (*slowest >= keys_per_s) return lowest_efficiency;
  // The simulated rate rises with the share: bisect for the share that gives `keys_per_s`.
  double low = lowest_efficiency, high = 1.0;
  for (int round = 0; round < fitting_rounds; ++round) {
    const double middle = (low + high) / 2;
    auto rate = simulated_keys_per_s(middle);
    if (!rate) return std::nullopt;
    (*rate < keys_per_s ? low : high) = middle;
  }
  return (low + high) / 2;
}

}  // namespace troupe::sim
