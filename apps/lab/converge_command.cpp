// `troupe converge JOB`: trains a job under several settings and seeds, in alternating order,
// and prints how soon each setting reaches training.target_accuracy (median and spread of the
// seconds, final accuracy, diverged runs), beside the simulator's prediction of the same table
// from this machine's profile, calibrated for each run just before and just after it and
// simulated once the race is over (converge_prediction.h).

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/job_file.h"
#include "apps/cli/child_train.h"
#include "apps/cli/commands.h"
#include "apps/cli/run_output.h"
#include "apps/cli/sweep_option.h"
#include "apps/lab/converge_prediction.h"
#include "apps/lab/race_table.h"
#include "sim/calibration/calibrate.h"
#include "sim/profile.h"

namespace troupe::apps {
namespace {

using json = nlohmann::json;

int bad_input(const std::string& message) {
  std::fprintf(stderr, "troupe converge: %s\n", message.c_str());
  return 2;
}

/// The settings of --setting and --sweep KEY=V1,V2 (one setting per value, named by it); the job
/// as it is when there are none.
std::optional<std::vector<setting>> settings_of(const converge_options& options,
                                                std::string* error) {
  std::optional<sweep_option> sweep;
  if (!options.sweep.empty() && !(sweep = parse_sweep(options.sweep, error))) return std::nullopt;
  auto settings = parse_settings(options.settings, sweep, error);
  if (settings && settings->empty()) settings->push_back({"job", {}, ""});
  return settings;
}

/// A real run in a `troupe train` process of its own.
race_outcome train_once(const converge_options& options, const std::vector<std::string>& overrides,
                        const std::string& out) {
  race_outcome result;
  const auto summary = train_in_child_process(options.job_file, overrides, 0, out);
  if (!summary) {
    std::ifstream log(out + "/train.log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    result.diverged = text.find("training diverged") != std::string::npos;
    result.failed = !result.diverged;
    if (result.failed) {
      std::fprintf(stderr, "troupe converge: a run failed; see %s/train.log\n", out.c_str());
    }
    return result;
  }
  if (summary->contains("time_to_target_s") && (*summary)["time_to_target_s"].is_number()) {
    result.to_target_s = (*summary)["time_to_target_s"].get<double>();
  }
  if (summary->contains("steps_to_target") && (*summary)["steps_to_target"].is_number_integer()) {
    result.to_target_step = (*summary)["steps_to_target"].get<int64_t>();
  }
  result.final_accuracy = summary->value("final_test_accuracy", 0.0);
  std::vector<std::vector<int64_t>> stages;
  for (const json& stage : summary->value("stages", json::array())) {
    const json histogram = stage.is_object() ? stage.value("staleness_histogram", json()) : json();
    if (!histogram.is_array()) continue;
    std::vector<int64_t>& counts = stages.emplace_back();
    for (const json& count : histogram) {
      counts.push_back(count.is_number_integer() ? count.get<int64_t>() : 0);
    }
  }
  result.mean_staleness = mean_staleness(stages);
  return result;
}

/// Every setting of the job must load, and the job must name a target to race to; 0, or 2 after
/// saying which does not.
int load_settings(const converge_options& options, const std::vector<setting>& settings,
                  std::vector<actors::job_config>* configs) {
  for (const setting& each : settings) {
    std::vector<std::string> overrides = options.overrides;
    overrides.insert(overrides.end(), each.overrides.begin(), each.overrides.end());
    actors::job_error problem;
    auto config = actors::load_job_file(options.job_file, overrides, &problem);
    if (!config) return bad_input("setting " + each.name + ": " + problem.message);
    if (config->training.target_accuracy <= 0) {
      return bad_input("setting " + each.name +
                       ": training.target_accuracy is not set; converge races to it (--set "
                       "training.target_accuracy=0.85)");
    }
    configs->push_back(*config);
  }
  return 0;
}

/// The race: every setting with every seed, in alternating order, each run beside the
/// simulator's prediction of it.
///
/// The profile each run is predicted from: --profile for all, or a calibration of the run's
/// setting taken beside it: the blocks' costs depend on the setting's micro-batch size (a
/// CPU GEMM of 16 samples costs more than a quarter of one of 64), on which stages compute at
/// once and on what the setting adds (a predicted copy of the weights), and this machine's
/// speed drifts over minutes, so calibrations taken for each run, in the same alternating
/// order, meet the machine as that run does. Now and then a calibration meets a spell in which
/// every pass runs 20-55 % slower and more unevenly than in the run it is for (its work_jitter
/// two or three times the others'), so each run gets two, just before and just after it, and
/// is predicted from the steadier.
class convergence_race {
 public:
  /// `given`: the --profile every run is predicted from (none: calibrations beside each).
  convergence_race(const converge_options& options, std::vector<setting> settings,
                   std::vector<actors::job_config> configs, std::string out,
                   std::optional<sim::machine_profile> given)
      : options_(options),
        settings_(std::move(settings)),
        configs_(std::move(configs)),
        out_(std::move(out)),
        given_(std::move(given)),
        predicting_(given_ || options.predict),
        measured_(settings_.size()),
        predicted_(settings_.size()) {}

  /// Rounds alternate the settings (A B C A B C ...): this machine's speed drifts.
  void run() {
    for (int seed = 1; seed <= options_.seeds; ++seed) {
      for (size_t s = 0; s < settings_.size(); ++s) race(s, seed);
    }
  }

  /// The simulations, once no run or calibration needs the machine: a numerics simulation can
  /// take longer than its run, so as many run side by side as fill the job's threads.
  void simulate();

  /// Prints the table and writes convergence.json; the exit status: 1 when a run failed or
  /// the prediction did.
  int report() const;

 private:
  /// Run `seed` of setting `s`, calibrated before and after when predicting.
  void race(size_t s, int seed);
  std::optional<sim::machine_profile> calibrate_for(size_t s, int seed, const char* when);
  /// The profile that predicts the run just measured: the steadier of `before` and a
  /// calibration taken now (or --profile); nothing, with `error_` set, when the calibration
  /// fails.
  std::optional<sim::machine_profile> profile_for(size_t s, int seed,
                                                  std::optional<sim::machine_profile> before);
  /// A calibration or simulation that fails ends the prediction, not the race: the runs go
  /// on, and the table gives what they measured.
  void stop_predicting(const char* consequence);

  const converge_options& options_;
  const std::vector<setting> settings_;
  const std::vector<actors::job_config> configs_;
  const std::string out_;
  const std::optional<sim::machine_profile> given_;
  bool predicting_;
  std::string error_;
  std::string prediction_failure_;
  std::vector<std::vector<race_outcome>> measured_, predicted_;  ///< by setting
  std::vector<run_to_simulate> to_simulate_;
};

void convergence_race::race(size_t s, int seed) {
  const setting& each = settings_[s];
  std::vector<std::string> overrides = options_.overrides;
  overrides.insert(overrides.end(), each.overrides.begin(), each.overrides.end());
  overrides.push_back("training.seed=" + std::to_string(seed));
  const std::string run_out = out_ + "/" + each.name + "-seed" + std::to_string(seed);
  std::optional<sim::machine_profile> before;
  if (predicting_ && !given_ && !(before = calibrate_for(s, seed, "before"))) {
    stop_predicting("the race goes on without the prediction");
  }
  measured_[s].push_back(train_once(options_, overrides, run_out));
  std::printf("troupe converge: [seed %d] %-20s %s\n", seed, each.name.c_str(),
              described(measured_[s].back()).c_str());
  std::fflush(stdout);
  if (!predicting_) return;
  auto profile = profile_for(s, seed, std::move(before));
  if (!profile) {
    stop_predicting("the race goes on without the prediction");
    return;
  }
  to_simulate_.push_back({s, each.name, seed, overrides, std::move(*profile)});
}

std::optional<sim::machine_profile> convergence_race::calibrate_for(size_t s, int seed,
                                                                    const char* when) {
  const std::string& name = settings_[s].name;
  std::printf(
      "troupe converge: [seed %d] calibrating this machine for %s, %s its run (%.2f s per "
      "block)\n",
      seed, name.c_str(), when, options_.seconds);
  std::fflush(stdout);
  auto calibrated = sim::calibrate(configs_[s], options_.seconds, &error_);
  if (!calibrated) {
    error_ = "calibration for " + name + " failed: " + error_;
    return std::nullopt;
  }
  std::ofstream(out_ + "/profile-" + name + "-seed" + std::to_string(seed) + "-" + when + ".json")
      << sim::to_json_text(*calibrated);
  return calibrated;
}

std::optional<sim::machine_profile> convergence_race::profile_for(
    size_t s, int seed, std::optional<sim::machine_profile> before) {
  if (given_) return given_;
  auto after = calibrate_for(s, seed, "after");
  if (!after) return std::nullopt;
  const bool later = after->work_jitter < before->work_jitter;
  std::printf(
      "troupe converge: [seed %d] %-20s predicting from the calibration %s the run "
      "(work_jitter %.3f before, %.3f after)\n",
      seed, settings_[s].name.c_str(), later ? "after" : "before", before->work_jitter,
      after->work_jitter);
  return later ? std::move(after) : std::move(before);
}

void convergence_race::stop_predicting(const char* consequence) {
  prediction_failure_ = error_;
  std::fprintf(stderr, "troupe converge: %s; %s\n", error_.c_str(), consequence);
  predicting_ = false;
}

void convergence_race::simulate() {
  if (!predicting_) return;
  const int parallel =
      std::min(simulations_at_once(configs_), static_cast<int>(to_simulate_.size()));
  std::printf("troupe converge: simulating the %zu runs, %d at a time\n", to_simulate_.size(),
              parallel);
  std::fflush(stdout);
  auto simulated = simulate_runs(options_.job_file, to_simulate_, parallel, &error_);
  if (!simulated) {
    stop_predicting("the table goes without the prediction");
    return;
  }
  for (size_t i = 0; i < simulated->size(); ++i) {
    predicted_[to_simulate_[i].setting].push_back((*simulated)[i]);
  }
}

int convergence_race::report() const {
  const json table = print_race_table(settings_, measured_, predicted_, predicting_,
                                      configs_.front().training.target_accuracy, options_.seeds);
  if (predicting_) {
    std::vector<std::string> names;
    for (const setting& each : settings_) names.push_back(each.name);
    print_ranking(names, measured_, predicted_);
  }
  const int written = write_json_output(out_ + "/convergence.json", table);
  if (!prediction_failure_.empty()) {
    std::fprintf(stderr, "troupe converge: no prediction: %s\n", prediction_failure_.c_str());
  }
  int failed = 0;
  for (const std::vector<race_outcome>& runs : measured_) failed += failed_count(runs);
  if (failed > 0) {
    std::fprintf(stderr,
                 "troupe converge: %d run%s failed (not counted in the medians); see the "
                 "train.log of each\n",
                 failed, failed == 1 ? "" : "s");
  }
  return failed > 0 || !prediction_failure_.empty() ? 1 : written;
}

}  // namespace

int run_converge(const converge_options& options) {
  std::string error;
  auto settings = settings_of(options, &error);
  if (!settings) return bad_input(error);
  std::vector<actors::job_config> configs;
  if (const int status = load_settings(options, *settings, &configs)) return status;
  const std::string out = options.out_directory.empty() ? "runs/converge" : options.out_directory;
  if (!make_directory(out, &error)) return bad_input(error);
  std::optional<sim::machine_profile> given;
  if (!options.profile_file.empty()) {
    given = sim::load_profile(options.profile_file, &error);
    if (!given) return bad_input(error);
  }
  convergence_race race(options, std::move(*settings), std::move(configs), out, std::move(given));
  race.run();
  race.simulate();
  return race.report();
}

}  // namespace troupe::apps
