// troupe: asynchronous model-parallel training. See README.md for the commands.

#include <CLI/CLI.hpp>
#include <cstdio>

#include "apps/commands.h"

namespace {

void add_train(CLI::App& app, troupe::apps::train_options& options) {
  CLI::App* train = app.add_subcommand("train", "Train the model a job file describes");
  train->add_option("job", options.job_file, "Job file (TOML)")->required();
  train
      ->add_option("--set", options.overrides,
                   "Override a job-file key: section.key=value (value in TOML syntax)")
      ->take_all()
      ->allow_extra_args(false);
  train->add_option("--out", options.out_directory, "Output directory (default: runs/<job name>)");
  train->add_flag("--quiet", options.quiet, "No progress bar; log lines only");
}

void add_bench(CLI::App& app, troupe::apps::bench_options& options) {
  CLI::App* bench = app.add_subcommand("bench", "Measure the compute backend or the pipeline");
  bench->add_option("what", options.what, "What to measure")
      ->check(CLI::IsMember({"compute", "pipeline"}))
      ->capture_default_str();
  bench->add_option("--device", options.device, "cpu, cuda or cuda:N")->capture_default_str();
  bench->add_option("--json", options.json_file, "Also write the figures to this JSON file");
  bench->add_option("--threads", options.threads, "CPU threads (0: every core)")
      ->check(CLI::NonNegativeNumber);
  bench->add_option("--seconds", options.seconds, "Time spent on each measurement")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe: asynchronous model-parallel training"};
  app.require_subcommand(1);
  troupe::apps::train_options train;
  troupe::apps::bench_options bench;
  add_train(app, train);
  add_bench(app, bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }
  if (app.got_subcommand("train")) return troupe::apps::run_train(train);
  if (bench.what == "pipeline") return troupe::apps::run_bench_pipeline(bench);
  return troupe::apps::run_bench(bench);
}
