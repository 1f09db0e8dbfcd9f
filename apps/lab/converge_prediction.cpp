// The simulator's side of `troupe converge`: each run of the race simulated on this machine
// from its calibration, numerics on, so that its runs learn in virtual time. A numerics
// simulation computes every pass of the run on one thread of simulated time, which is why it
// can take longer than the run itself on the cores that ran it; the race's simulations run
// once all its runs are over, so they never share the machine with a run or a calibration,
// and as many side by side as fill the cores.

#include "apps/lab/converge_prediction.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/engine/run_reports.h"
#include "actors/engine/stage_settings.h"
#include "sim/calibration/this_machine.h"
#include "sim/simulation.h"

namespace troupe::apps {
namespace {

/// The run simulated on this machine (in this process) with its profile.
std::optional<race_outcome> simulate_once(const std::string& job_file, const run_to_simulate& run,
                                          std::string* error) {
  actors::job_error problem;
  auto config = actors::load_job_file(job_file, run.overrides, &problem);
  if (!config) {
    *error = problem.message;
    return std::nullopt;
  }
  auto data = actors::load_job_data(*config, error);
  if (!data) return std::nullopt;
  auto machine = sim::this_machine(run.profile, true, error);
  if (!machine) return std::nullopt;
  sim::simulation_options settings;
  settings.trace_spans = 0;
  settings.numerics = true;
  settings.profile = run.profile;
  settings.message_cpu_s = run.profile.inproc_message_cpu_s;
  settings.message_cpu_per_byte_s = run.profile.inproc_message_cpu_per_byte_s;
  actors::quiet_observer quiet;
  race_outcome result;
  auto simulated = sim::simulate(*config, *data, *machine, settings, quiet, error);
  if (!simulated) {
    if (error->find("training diverged") == std::string::npos) return std::nullopt;
    error->clear();
    result.diverged = true;
    return result;
  }
  result.to_target_s = simulated->summary.time_to_target_s;
  result.to_target_step = simulated->summary.steps_to_target;
  result.final_accuracy = simulated->summary.final_test_accuracy;
  result.mean_staleness = mean_staleness(simulated->stage_staleness_histograms);
  return result;
}

}  // namespace

std::string described(const race_outcome& run) {
  char text[128];
  if (run.failed || run.diverged) {
    std::snprintf(text, sizeof text, "%s", run.failed ? "failed" : "diverged");
  } else if (run.to_target_s) {
    // A run resumed from a checkpoint of an older build knows the time but not the step.
    const std::string step =
        run.to_target_step ? " (step " + std::to_string(*run.to_target_step) + ")" : "";
    std::snprintf(text, sizeof text, "target after %.1f s%s, final accuracy %.4f", *run.to_target_s,
                  step.c_str(), run.final_accuracy);
  } else {
    std::snprintf(text, sizeof text, "target not reached, final accuracy %.4f", run.final_accuracy);
  }
  return text;
}

std::optional<double> mean_staleness(const std::vector<std::vector<int64_t>>& stages) {
  std::vector<int64_t> pooled;  // every stage's backward passes together
  for (const std::vector<int64_t>& histogram : stages) {
    if (pooled.size() < histogram.size()) pooled.resize(histogram.size(), 0);
    for (size_t i = 0; i < histogram.size(); ++i) pooled[i] += histogram[i];
  }
  return actors::mean_staleness(pooled);
}

int simulations_at_once(const std::vector<actors::job_config>& configs) {
  int threads = 1, per_simulation = 1;
  for (const actors::job_config& config : configs) {
    threads = std::max(threads, actors::job_threads(config));
    per_simulation = std::max(per_simulation, actors::threads_per_stage(config));
  }
  return std::max(1, threads / per_simulation);
}

std::optional<std::vector<race_outcome>> simulate_runs(const std::string& job_file,
                                                       const std::vector<run_to_simulate>& runs,
                                                       int parallel, std::string* error) {
  std::vector<std::optional<race_outcome>> outcomes(runs.size());
  std::atomic<size_t> next{0};
  std::mutex lock;  // guards `failure` and the printed lines
  std::string failure;
  const auto simulate_next = [&] {
    for (size_t i = next++; i < runs.size(); i = next++) {
      const run_to_simulate& run = runs[i];
      {
        std::lock_guard<std::mutex> hold(lock);
        if (!failure.empty()) return;
        std::fprintf(stderr, "troupe converge: [seed %d] simulating %s with its calibration\n",
                     run.seed, run.name.c_str());
      }
      const auto started = std::chrono::steady_clock::now();
      std::string problem;
      outcomes[i] = simulate_once(job_file, run, &problem);
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::lock_guard<std::mutex> hold(lock);
      if (!outcomes[i]) {
        if (failure.empty()) failure = "simulating " + run.name + ": " + problem;
        return;
      }
      std::printf("troupe converge: [seed %d] %-20s predicted: %s (simulated in %.1f s)\n",
                  run.seed, run.name.c_str(), described(*outcomes[i]).c_str(), took);
      std::fflush(stdout);
    }
  };
  std::vector<std::thread> helpers;
  const size_t side_by_side = std::min(runs.size(), static_cast<size_t>(std::max(1, parallel)));
  for (size_t t = 1; t < side_by_side; ++t) helpers.emplace_back(simulate_next);
  simulate_next();
  for (std::thread& helper : helpers) helper.join();
  if (!failure.empty()) {
    *error = failure;
    return std::nullopt;
  }
  std::vector<race_outcome> result;
  for (auto& each : outcomes) result.push_back(*each);
  return result;
}

}  // namespace troupe::apps
