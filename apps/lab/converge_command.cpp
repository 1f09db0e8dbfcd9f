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
#include "apps/lab/statistics.h"
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

/// Seconds to the target of the runs that reached it.
std::vector<double> reached_seconds(const std::vector<race_outcome>& runs) {
  std::vector<double> seconds;
  for (const race_outcome& run : runs) {
    if (run.to_target_s) seconds.push_back(*run.to_target_s);
  }
  return seconds;
}

/// The median of `field` over the runs that have it, printed with `format` ("-" where none has).
template <typename T>
std::string median_cell(const std::vector<race_outcome>& runs,
                        std::optional<T> race_outcome::*field, const char* format) {
  std::vector<double> values;
  for (const race_outcome& run : runs) {
    if (run.*field) values.push_back(static_cast<double>(*(run.*field)));
  }
  if (values.empty()) return "-";
  char text[32];
  std::snprintf(text, sizeof text, format, median(values));
  return text;
}

/// The median of the steps at which the runs that reached the target reached it.
std::string steps_cell(const std::vector<race_outcome>& runs) {
  return median_cell(runs, &race_outcome::to_target_step, "%.0f");
}

/// "median (min-max)" of the runs that reached the target, and how many did.
std::string seconds_cell(const std::vector<race_outcome>& runs, int* reached) {
  const std::vector<double> seconds = reached_seconds(runs);
  *reached = static_cast<int>(seconds.size());
  if (seconds.empty()) return "-";
  char text[64];
  std::snprintf(text, sizeof text, "%.1f (%.1f-%.1f)", median(seconds),
                *std::min_element(seconds.begin(), seconds.end()),
                *std::max_element(seconds.begin(), seconds.end()));
  return text;
}

/// How the prediction orders the settings by their median seconds to the target, pair by pair,
/// counting apart the pairs whose middle runs do not overlap (compare_rankings()): a ranking of
/// settings within each other's spread is not settled by the runs themselves.
void print_ranking(const std::vector<std::string>& names,
                   const std::vector<std::vector<race_outcome>>& measured,
                   const std::vector<std::vector<race_outcome>>& predicted) {
  std::vector<std::vector<double>> measured_seconds, predicted_seconds;
  for (size_t s = 0; s < names.size(); ++s) {
    measured_seconds.push_back(reached_seconds(measured[s]));
    predicted_seconds.push_back(reached_seconds(predicted[s]));
  }
  const ranking_agreement ranking = compare_rankings(measured_seconds, predicted_seconds);
  std::printf(
      "ranking: the prediction orders %d of %d pairs of settings as measured; %d of the %d pairs "
      "whose middle runs do not overlap\n",
      ranking.agreeing, ranking.pairs, ranking.apart_agreeing, ranking.apart);
  for (const ranked_pair& pair : ranking.disagreeing) {
    const double measured_i = ranking.measured_medians[pair.i];
    const double measured_j = ranking.measured_medians[pair.j];
    const double predicted_i = ranking.predicted_medians[pair.i];
    const double predicted_j = ranking.predicted_medians[pair.j];
    std::printf(
        "  %s / %s: measured %.1f %c %.1f s (median steps %s / %s), predicted %.1f %c %.1f s%s\n",
        names[pair.i].c_str(), names[pair.j].c_str(), measured_i,
        measured_i < measured_j ? '<' : '>', measured_j, steps_cell(measured[pair.i]).c_str(),
        steps_cell(measured[pair.j]).c_str(), predicted_i, predicted_i < predicted_j ? '<' : '>',
        predicted_j, pair.apart ? "" : " (their middle runs overlap)");
  }
}

double median_accuracy(const std::vector<race_outcome>& runs) {
  std::vector<double> accuracies;
  for (const race_outcome& run : runs) {
    if (!run.diverged && !run.failed) accuracies.push_back(run.final_accuracy);
  }
  return median(accuracies);
}

/// The median of the runs' mean staleness.
std::string staleness_cell(const std::vector<race_outcome>& runs) {
  return median_cell(runs, &race_outcome::mean_staleness, "%.2f");
}

int diverged_count(const std::vector<race_outcome>& runs) {
  return static_cast<int>(std::count_if(runs.begin(), runs.end(),
                                        [](const race_outcome& run) { return run.diverged; }));
}

int failed_count(const std::vector<race_outcome>& runs) {
  return static_cast<int>(
      std::count_if(runs.begin(), runs.end(), [](const race_outcome& run) { return run.failed; }));
}

json runs_json(const std::vector<race_outcome>& runs) {
  json result = json::array();
  for (const race_outcome& run : runs) {
    result.push_back({{"diverged", run.diverged},
                      {"failed", run.failed},
                      {"time_to_target_s", run.to_target_s ? json(*run.to_target_s) : json()},
                      {"steps_to_target", run.to_target_step ? json(*run.to_target_step) : json()},
                      {"final_test_accuracy", run.final_accuracy},
                      {"mean_staleness", run.mean_staleness ? json(*run.mean_staleness) : json()}});
  }
  return result;
}

}  // namespace

int run_converge(const converge_options& options) {
  std::string error;
  auto settings = settings_of(options, &error);
  if (!settings) return bad_input(error);
  // Every setting must load, and the job must name a target to race to.
  std::vector<actors::job_config> configs;
  for (const setting& each : *settings) {
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
    configs.push_back(*config);
  }
  const std::string out = options.out_directory.empty() ? "runs/converge" : options.out_directory;
  if (!make_directory(out, &error)) return bad_input(error);

  // The profile each run is predicted from: --profile for all, or a calibration of the run's
  // setting taken beside it: the blocks' costs depend on the setting's micro-batch size (a
  // CPU GEMM of 16 samples costs more than a quarter of one of 64), on which stages compute at
  // once and on what the setting adds (a predicted copy of the weights), and this machine's
  // speed drifts over minutes, so calibrations taken for each run, in the same alternating
  // order, meet the machine as that run does. Now and then a calibration meets a spell in which
  // every pass runs 20-55 % slower and more unevenly than in the run it is for (its work_jitter
  // two or three times the others'), so each run gets two, just before and just after it, and
  // is predicted from the steadier.
  const size_t count = settings->size();
  std::optional<sim::machine_profile> given;
  if (!options.profile_file.empty()) {
    given = sim::load_profile(options.profile_file, &error);
    if (!given) return bad_input(error);
  }
  bool predicting = given || options.predict;
  const auto calibrate_for = [&](size_t s, int seed,
                                 const char* when) -> std::optional<sim::machine_profile> {
    const std::string& name = (*settings)[s].name;
    std::printf(
        "troupe converge: [seed %d] calibrating this machine for %s, %s its run (%.2f s per "
        "block)\n",
        seed, name.c_str(), when, options.seconds);
    std::fflush(stdout);
    auto calibrated = sim::calibrate(configs[s], options.seconds, &error);
    if (!calibrated) {
      error = "calibration for " + name + " failed: " + error;
      return std::nullopt;
    }
    std::ofstream(out + "/profile-" + name + "-seed" + std::to_string(seed) + "-" + when + ".json")
        << sim::to_json_text(*calibrated);
    return calibrated;
  };

  // The profile that predicts the run just measured: the steadier of `before` and a
  // calibration taken now (or --profile); nothing, with `error` set, when the calibration fails.
  const auto profile_for =
      [&](size_t s, int seed,
          std::optional<sim::machine_profile> before) -> std::optional<sim::machine_profile> {
    if (given) return given;
    auto after = calibrate_for(s, seed, "after");
    if (!after) return std::nullopt;
    const bool later = after->work_jitter < before->work_jitter;
    std::printf(
        "troupe converge: [seed %d] %-20s predicting from the calibration %s the run "
        "(work_jitter %.3f before, %.3f after)\n",
        seed, (*settings)[s].name.c_str(), later ? "after" : "before", before->work_jitter,
        after->work_jitter);
    return later ? std::move(after) : std::move(before);
  };

  std::vector<std::vector<race_outcome>> measured(count), predicted(count);
  std::vector<run_to_simulate> to_simulate;
  // A calibration or simulation that fails ends the prediction, not the race: the runs go on,
  // and the table gives what they measured.
  std::string prediction_failure;
  const auto stop_predicting = [&](const char* consequence) {
    prediction_failure = error;
    std::fprintf(stderr, "troupe converge: %s; %s\n", error.c_str(), consequence);
    predicting = false;
  };
  // Rounds alternate the settings (A B C A B C ...): this machine's speed drifts.
  for (int seed = 1; seed <= options.seeds; ++seed) {
    for (size_t s = 0; s < count; ++s) {
      const setting& each = (*settings)[s];
      std::vector<std::string> overrides = options.overrides;
      overrides.insert(overrides.end(), each.overrides.begin(), each.overrides.end());
      overrides.push_back("training.seed=" + std::to_string(seed));
      const std::string run_out = out + "/" + each.name + "-seed" + std::to_string(seed);
      std::optional<sim::machine_profile> before;
      if (predicting && !given && !(before = calibrate_for(s, seed, "before"))) {
        stop_predicting("the race goes on without the prediction");
      }
      measured[s].push_back(train_once(options, overrides, run_out));
      std::printf("troupe converge: [seed %d] %-20s %s\n", seed, each.name.c_str(),
                  described(measured[s].back()).c_str());
      std::fflush(stdout);
      if (!predicting) continue;
      auto profile = profile_for(s, seed, std::move(before));
      if (!profile) {
        stop_predicting("the race goes on without the prediction");
        continue;
      }
      to_simulate.push_back({s, each.name, seed, overrides, std::move(*profile)});
    }
  }
  // The simulations, once no run or calibration needs the machine: a numerics simulation can
  // take longer than its run, so as many run side by side as fill the job's threads.
  if (predicting) {
    const int parallel =
        std::min(simulations_at_once(configs), static_cast<int>(to_simulate.size()));
    std::printf("troupe converge: simulating the %zu runs, %d at a time\n", to_simulate.size(),
                parallel);
    std::fflush(stdout);
    auto simulated = simulate_runs(options.job_file, to_simulate, parallel, &error);
    if (simulated) {
      for (size_t i = 0; i < simulated->size(); ++i) {
        predicted[to_simulate[i].setting].push_back((*simulated)[i]);
      }
    } else {
      stop_predicting("the table goes without the prediction");
    }
  }

  std::printf("\n%-20s %5s %9s %7s %8s %22s %6s %10s %9s", "setting", "runs", "diverged", "failed",
              "reached", "to target s (min-max)", "steps", "final acc", "staleness");
  if (predicting) {
    std::printf(" | %22s %6s %10s %9s %9s", "predicted to target s", "steps", "final acc",
                "diverged", "staleness");
  }
  std::printf("\n");
  json table = json::array();
  int failed = 0;
  for (size_t s = 0; s < count; ++s) {
    failed += failed_count(measured[s]);
    int reached = 0, predicted_reached = 0;
    const std::string seconds = seconds_cell(measured[s], &reached);
    std::printf("%-20s %5zu %9d %7d %8d %22s %6s %10.4f %9s", (*settings)[s].name.c_str(),
                measured[s].size(), diverged_count(measured[s]), failed_count(measured[s]), reached,
                seconds.c_str(), steps_cell(measured[s]).c_str(), median_accuracy(measured[s]),
                staleness_cell(measured[s]).c_str());
    json row = {{"setting", (*settings)[s].name},
                {"overrides", (*settings)[s].overrides},
                {"runs", runs_json(measured[s])}};
    if (predicting) {
      const std::string predicted_seconds = seconds_cell(predicted[s], &predicted_reached);
      std::printf(" | %22s %6s %10.4f %9d %9s", predicted_seconds.c_str(),
                  steps_cell(predicted[s]).c_str(), median_accuracy(predicted[s]),
                  diverged_count(predicted[s]), staleness_cell(predicted[s]).c_str());
      row["predicted"] = runs_json(predicted[s]);
    }
    std::printf("\n");
    table.push_back(row);
  }
  std::printf(
      "(seconds from the start of each run to its first evaluation at or above "
      "training.target_accuracy (%.4g), evaluations included; medians over the runs that "
      "reached it; steps: the median of the optimizer steps completed by then; seeds 1-%d, "
      "settings in alternating order; staleness: the median over the runs "
      "of the mean staleness of every backward pass)\n",
      configs.front().training.target_accuracy, options.seeds);
  if (predicting) {
    std::vector<std::string> names;
    for (const setting& each : *settings) names.push_back(each.name);
    print_ranking(names, measured, predicted);
  }
  const int written = write_json_output(out + "/convergence.json", table);
  if (!prediction_failure.empty()) {
    std::fprintf(stderr, "troupe converge: no prediction: %s\n", prediction_failure.c_str());
  }
  if (failed > 0) {
    std::fprintf(stderr,
                 "troupe converge: %d run%s failed (not counted in the medians); see the "
                 "train.log of each\n",
                 failed, failed == 1 ? "" : "s");
  }
  return failed > 0 || !prediction_failure.empty() ? 1 : written;
}

}  // namespace troupe::apps
