// troupe: asynchronous model-parallel training. See README.md for the commands.

#include <malloc.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <new>

#include "apps/cli/commands.h"
#include "layers/out_of_memory.h"

namespace {

/// An option whose value may be left out (`--name` or `--name VALUE`): sets `given`, and
/// `value` to the value or to "".
void add_option_with_optional_value(CLI::App* command, const std::string& name, bool* given,
                                    std::string* value, const std::string& help) {
  command
      ->add_option_function<std::vector<std::string>>(
          name,
          [given, value](const std::vector<std::string>& values) {
            *given = true;
            *value = values.empty() ? "" : values.front();
          },
          help)
      ->expected(0, 1)
      ->allow_extra_args(false);
}

void add_resume(CLI::App* command, troupe::apps::train_options& options) {
  add_option_with_optional_value(command, "--resume", &options.resume, &options.resume_path,
                                 "Continue from the latest checkpoint, or from PATH (a checkpoint, "
                                 "a checkpoints directory or a run directory)");
}

void add_dashboard_options(CLI::App* command, troupe::apps::train_options& options) {
  add_option_with_optional_value(command, "--dashboard", &options.dashboard,
                                 &options.dashboard_address,
                                 "Serve a live dashboard at HOST:PORT (default 127.0.0.1:8265)");
  command->add_option("--dashboard-token", options.dashboard_token,
                      "Token every dashboard request must carry (needed off loopback)");
}

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
  train
      ->add_option("--workers", options.workers,
                   "Run the stages in N local worker processes (over ipc://)")
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--heartbeat-timeout", options.heartbeat_timeout_s,
                   "With --workers: seconds of silence after which a worker counts as dead")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  add_resume(train, options);
  add_dashboard_options(train, options);
}

void add_coordinator(CLI::App& app, troupe::apps::train_options& options) {
  CLI::App* coordinator =
      app.add_subcommand("coordinator", "Train a job with workers that join from elsewhere");
  coordinator->add_option("job", options.job_file, "Job file (TOML)")->required();
  coordinator->add_option("--listen", options.listen, "Address to receive on, e.g. tcp://HOST:PORT")
      ->required();
  coordinator->add_option("--workers", options.workers, "Number of workers to wait for")
      ->required()
      ->check(CLI::PositiveNumber);
  coordinator->add_option("--set", options.overrides, "Override a job-file key: section.key=value")
      ->take_all()
      ->allow_extra_args(false);
  coordinator->add_option("--out", options.out_directory, "Output directory");
  coordinator->add_flag("--quiet", options.quiet, "No progress bar; log lines only");
  coordinator
      ->add_option("--heartbeat-timeout", options.heartbeat_timeout_s,
                   "Seconds of silence after which a worker counts as dead")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  coordinator->add_option("--keys", options.keys_directory,
                          "CURVE key directory (this node's NAME.key, every node's .pub)");
  coordinator->add_option("--key-name", options.key_name, "This node's key name")
      ->capture_default_str();
  coordinator->add_flag("--insecure", options.insecure, "Allow unencrypted non-loopback addresses");
  add_resume(coordinator, options);
  add_dashboard_options(coordinator, options);
}

void add_dashboard(CLI::App& app, troupe::apps::dashboard_options& options) {
  CLI::App* dashboard =
      app.add_subcommand("dashboard", "Serve the dashboard of a run or simulation directory");
  dashboard
      ->add_option("run", options.run_directory, "Run directory (troupe train or simulate --out)")
      ->required();
  dashboard->add_option("--listen", options.address, "HOST:PORT (default 127.0.0.1:8265)");
  dashboard->add_option("--dashboard-token", options.token,
                        "Token every request must carry (needed off loopback)");
}

void add_keygen(CLI::App& app, troupe::apps::keygen_options& options) {
  CLI::App* keygen = app.add_subcommand("keygen", "Write a CURVE key pair for a cluster node");
  keygen->add_option("directory", options.directory, "Key directory")->required();
  keygen->add_option("--name", options.name, "Key name (default: this host's name)");
}

void add_launch(CLI::App& app, troupe::apps::launch_options& options) {
  CLI::App* launch =
      app.add_subcommand("launch", "Run as one rank of srun, mpirun, torchrun or a hostfile");
  launch->add_option("job", options.train.job_file, "Job file (TOML)")->required();
  launch->add_option("--set", options.train.overrides, "Override a job-file key")
      ->take_all()
      ->allow_extra_args(false);
  launch->add_option("--out", options.train.out_directory, "Output directory (rank 0)");
  launch->add_flag("--quiet", options.train.quiet, "No progress bar; log lines only");
  launch
      ->add_option("--port", options.default_port, "Coordinator port when the launcher names none")
      ->capture_default_str();
  launch
      ->add_option("--heartbeat-timeout", options.train.heartbeat_timeout_s,
                   "Seconds of silence after which a peer counts as dead")
      ->capture_default_str();
  launch->add_option("--keys", options.train.keys_directory,
                     "CURVE key directory (this node's NAME.key, every node's .pub)");
  launch->add_option("--key-name", options.worker_key_name,
                     "This rank's key name (default: coordinator on rank 0, else the host name)");
  launch->add_flag("--insecure", options.train.insecure,
                   "Allow unencrypted non-loopback addresses");
  add_resume(launch, options.train);
  add_dashboard_options(launch, options.train);  // served by rank 0, the coordinator
}

void add_worker(CLI::App& app, troupe::apps::worker_command_options& options) {
  CLI::App* worker = app.add_subcommand("worker", "Host the stages a coordinator assigns");
  worker->add_option("--coordinator", options.coordinator, "The coordinator's address")->required();
  worker->add_option("--listen", options.listen, "Address to receive on")->capture_default_str();
  worker
      ->add_option("--heartbeat-timeout", options.heartbeat_timeout_s,
                   "Seconds of silence after which the coordinator counts as gone")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  worker->add_option("--keys", options.keys_directory,
                     "CURVE key directory (this node's NAME.key, every node's .pub)");
  worker->add_option("--key-name", options.key_name, "This node's key name (default: host name)");
  worker
      ->add_option("--coordinator-key", options.coordinator_key_name,
                   "Key name of the coordinator's .pub")
      ->capture_default_str();
  worker->add_flag("--insecure", options.insecure, "Allow unencrypted non-loopback addresses");
}

void add_bench(CLI::App& app, troupe::apps::bench_options& options) {
  CLI::App* bench = app.add_subcommand("bench", "Measure the compute backend or the pipeline");
  bench->add_option("what", options.what, "What to measure")
      ->check(CLI::IsMember({"compute", "pipeline", "transport", "checkpoint", "hop"}))
      ->capture_default_str();
  bench->add_option("--device", options.device, "cpu, cuda or cuda:N (compute, pipeline)")
      ->capture_default_str();
  bench
      ->add_option("--precision", options.precision,
                   "GEMM precision of compute and pipeline: fp32, tf32 or bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}))
      ->capture_default_str();
  bench->add_option("--json", options.json_file, "Also write the figures to this JSON file");
  bench->add_option("--threads", options.threads, "CPU threads (0: every core)")
      ->check(CLI::NonNegativeNumber);
  bench->add_option("--seconds", options.seconds, "Time spent on each measurement")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

void add_inspect(CLI::App& app, troupe::apps::inspect_options& options) {
  CLI::App* inspect = app.add_subcommand("inspect", "Print a checkpoint's manifest and verify it");
  inspect
      ->add_option("path", options.path, "Checkpoint step directory, checkpoints directory or run")
      ->required();
}

void add_export(CLI::App& app, troupe::apps::export_options& options) {
  CLI::App* exporter = app.add_subcommand("export", "Write a checkpoint's weights for other tools");
  exporter->add_option("checkpoint", options.checkpoint, "Checkpoint directory")->required();
  exporter->add_option("out", options.out, "Output file")->required();
  exporter->add_flag("--initial", options.initial,
                     "CHECKPOINT is a job file: write the weights the job starts from");
  exporter->add_option("--set", options.overrides, "With --initial: override a job-file key")
      ->take_all()
      ->allow_extra_args(false);
  exporter->add_option("--format", options.format, "Output format")
      ->check(CLI::IsMember({"safetensors"}))
      ->capture_default_str();
}

void add_generate(CLI::App& app, troupe::apps::generate_options& options) {
  CLI::App* generate = app.add_subcommand("generate", "Sample text from a trained language model");
  generate
      ->add_option("checkpoint", options.weights,
                   "Checkpoint, checkpoints directory, run directory or .safetensors file")
      ->required();
  generate->add_option("--prompt", options.prompt, "Text to continue")->required();
  generate->add_option("--tokens", options.tokens, "Tokens (bytes) to generate")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}))
      ->capture_default_str();
  generate->add_option("--temperature", options.temperature, "Sampling temperature (0: greedy)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  generate->add_option("--seed", options.seed, "Seed of the sampling")->capture_default_str();
  generate->add_option("--job", options.job_file,
                       "Job file of the weights (default: the run's config.json)");
}

void add_simulate(CLI::App& app, troupe::apps::simulate_options& options) {
  CLI::App* simulate =
      app.add_subcommand("simulate", "Predict a job's behaviour on a modelled cluster");
  simulate->add_option("job", options.job_file, "Job file (TOML)")->required();
  simulate->add_option("--cluster", options.cluster_file, "Cluster file (TOML)")->required();
  simulate->add_option("--set", options.overrides, "Override a job-file key: section.key=value")
      ->take_all()
      ->allow_extra_args(false);
  simulate->add_option("--sweep", options.sweep,
                       "KEY=V1,V2,...: simulate once per value and print one row each");
  simulate
      ->add_option("--setting", options.settings,
                   "NAME:KEY=VALUE[,KEY=VALUE...]: simulate the job with these overrides as one "
                   "row of the table (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  simulate->add_option("--out", options.out_directory,
                       "Output directory (default: runs/simulation)");
  simulate->add_flag("--numerics", options.numerics,
                     "Really run the math on the CPU: loss and accuracy against simulated time");
  simulate->add_option("--seed", options.seed, "Seed of the simulation's random draws")
      ->capture_default_str();
  simulate->add_option("--straggler", options.stragglers,
                       "DEVICE=SLOWDOWN[@PROBABILITY]: a device whose work is slower");
  simulate->add_option("--profile", options.profile_file,
                       "Charge the block times and transport measured by troupe calibrate");
  simulate->add_option("--degrade", options.degradations,
                       "LINK=FACTOR@START-END: a link's bandwidth times FACTOR for a while");
  simulate->add_option("--fail", options.failures,
                       "DEVICE@SECONDS: the worker on DEVICE dies then; the run recovers from "
                       "its latest checkpoint");
  simulate
      ->add_option("--heartbeat-timeout", options.heartbeat_timeout_s,
                   "Seconds from a worker's death to the coordinator noticing it")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  simulate
      ->add_option("--restart-s", options.restart_s,
                   "Seconds for a replacement worker to start and join")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

void add_calibrate(CLI::App& app, troupe::apps::calibrate_options& options) {
  CLI::App* calibrate =
      app.add_subcommand("calibrate", "Time a job's blocks and the transport on this machine");
  calibrate->add_option("job", options.job_file, "Job file (TOML)")->required();
  calibrate->add_option("--out", options.out_file, "Profile to write (JSON)")->required();
  calibrate->add_option("--set", options.overrides, "Override a job-file key: section.key=value")
      ->take_all()
      ->allow_extra_args(false);
  calibrate->add_option("--seconds", options.seconds, "Time spent on each block")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
}

void add_dataset(CLI::App& app, troupe::apps::dataset_options& options) {
  CLI::App* dataset = app.add_subcommand(
      "dataset", "Write the training and test instances of a graph model's job, for other tools");
  dataset->add_option("job", options.job_file, "Job file (TOML)")->required();
  dataset->add_option("--out", options.out_directory, "Output directory")->required();
  dataset->add_option("--set", options.overrides, "Override a job-file key: section.key=value")
      ->take_all()
      ->allow_extra_args(false);
}

void add_validate(CLI::App& app, troupe::apps::validate_options& options) {
  CLI::App* validate = app.add_subcommand(
      "validate", "Compare real runs on this machine with the simulator's predictions");
  validate->add_option("job", options.job_file, "Job file (TOML)")->required();
  validate->add_option("--set", options.overrides, "Override a job-file key: section.key=value")
      ->take_all()
      ->allow_extra_args(false);
  validate->add_option("--steps", options.steps, "Optimizer steps of every real run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  validate->add_option("--runs", options.runs, "Real runs per configuration (their median counts)")
      ->check(CLI::Range(1, 99))
      ->capture_default_str();
  validate->add_option("--seconds", options.seconds, "Calibration time per block")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  validate->add_option("--out", options.out_directory, "Output directory (default: runs/validate)");
  validate->add_option("--stages", options.stages, "Pipeline depths to validate (default 1,2,4)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  validate
      ->add_option("--replicas", options.replicas,
                   "Replica counts to validate, each with every depth (default 1)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
}

void add_converge(CLI::App& app, troupe::apps::converge_options& options) {
  CLI::App* converge = app.add_subcommand(
      "converge",
      "Race settings of a job to training.target_accuracy over seeds, real and simulated");
  converge->add_option("job", options.job_file, "Job file (TOML)")->required();
  converge->add_option("--set", options.overrides, "Override a job-file key for every setting")
      ->take_all()
      ->allow_extra_args(false);
  converge
      ->add_option("--setting", options.settings,
                   "A setting to race: NAME:KEY=VALUE[,KEY=VALUE...] (repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  converge->add_option("--sweep", options.sweep, "KEY=V1,V2,...: one setting per value");
  converge->add_option("--seeds", options.seeds, "Runs per setting (training.seed 1 ... N)")
      ->check(CLI::Range(1, 99))
      ->capture_default_str();
  converge->add_option("--profile", options.profile_file,
                       "A calibrated profile for every run (default: calibrate each run's "
                       "setting here, before and after the run, and use the steadier)");
  converge->add_option("--seconds", options.seconds, "Calibration time per block")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  converge->add_flag("!--no-prediction", options.predict, "Only the real runs, no simulation");
  converge->add_option("--out", options.out_directory, "Output directory (default: runs/converge)");
}

void add_plot(CLI::App& app, troupe::apps::plot_options& options) {
  CLI::App* plot = app.add_subcommand("plot", "Write PNG and SVG figures of runs, overlaid");
  plot->add_option("runs", options.run_directories, "Run directories (troupe train --out)")
      ->required();
  plot->add_option("--out", options.out_directory, "Directory of the figures")->required();
  plot->add_option("--label", options.labels, "Legend label of a run (once per run, in order)")
      ->allow_extra_args(false);
  plot->add_option("--window", options.window,
                   "START:END: the Gantt chart's seconds from the start of the trace (default: "
                   "the last 2 s of training work)");
}

void add_keys(CLI::App& app, troupe::apps::keys_options& options) {
  CLI::App* keys =
      app.add_subcommand("keys", "List every job-file key with its default and description");
  keys->add_option("section", options.section, "Only this section (model, data, parallelism, ...)");
  keys->add_flag("--markdown", options.markdown,
                 "Print the Markdown of docs/guide/job-file.md instead");
}

/// Keeps freed memory in the process. A stage receives every key's activations into a buffer
/// that ZeroMQ allocates and frees per message; glibc hands large blocks back to the kernel
/// (above its mmap threshold, or by trimming the heap), so every message's pages were faulted
/// in afresh: on a 4-process CNN pipeline, the page faults of ZeroMQ's receives took more CPU
/// than the convolutions. Blocks up to 32 MiB now come from the heap, which keeps up to
/// 512 MiB of free memory at its top.
void keep_freed_memory() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  // Line by line into a pipe or a file too (`| tee`, a launcher's log): every command prints
  // its progress and tables a line at a time, and a line should appear when it is written.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"troupe: asynchronous model-parallel training"};
  app.require_subcommand(1);
  troupe::apps::train_options train;
  troupe::apps::bench_options bench;
  troupe::apps::train_options coordinator;
  troupe::apps::worker_command_options worker;
  troupe::apps::keygen_options keygen;
  troupe::apps::launch_options launch;
  add_train(app, train);
  add_keygen(app, keygen);
  add_launch(app, launch);
  add_coordinator(app, coordinator);
  add_worker(app, worker);
  add_bench(app, bench);
  troupe::apps::inspect_options inspect;
  troupe::apps::export_options exporter;
  add_inspect(app, inspect);
  add_export(app, exporter);
  troupe::apps::generate_options generate;
  add_generate(app, generate);
  troupe::apps::simulate_options simulate;
  add_simulate(app, simulate);
  troupe::apps::calibrate_options calibrate;
  add_calibrate(app, calibrate);
  troupe::apps::dataset_options dataset;
  add_dataset(app, dataset);
  troupe::apps::validate_options validate;
  add_validate(app, validate);
  troupe::apps::converge_options converge;
  add_converge(app, converge);
  troupe::apps::plot_options plot;
  add_plot(app, plot);
  troupe::apps::dashboard_options dashboard;
  add_dashboard(app, dashboard);
  troupe::apps::keys_options keys;
  add_keys(app, keys);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }
  // A job that asks for more memory than the machine has ends with one line saying what ran
  // out, as bad input does (the stage actors' threads end the same way: actor_hosting.h).
  try {
    if (app.got_subcommand("train")) return troupe::apps::run_train(train);
    if (app.got_subcommand("coordinator")) return troupe::apps::run_train(coordinator);
    if (app.got_subcommand("worker")) return troupe::apps::run_worker_command(worker);
    if (app.got_subcommand("dashboard")) return troupe::apps::run_dashboard(dashboard);
    if (app.got_subcommand("keygen")) return troupe::apps::run_keygen(keygen);
    if (app.got_subcommand("launch")) return troupe::apps::run_launch(launch);
    if (app.got_subcommand("inspect")) return troupe::apps::run_inspect(inspect);
    if (app.got_subcommand("export")) return troupe::apps::run_export(exporter);
    if (app.got_subcommand("generate")) return troupe::apps::run_generate(generate);
    if (app.got_subcommand("simulate")) return troupe::apps::run_simulate(simulate);
    if (app.got_subcommand("calibrate")) return troupe::apps::run_calibrate(calibrate);
    if (app.got_subcommand("dataset")) return troupe::apps::run_dataset(dataset);
    if (app.got_subcommand("validate")) return troupe::apps::run_validate(validate);
    if (app.got_subcommand("converge")) return troupe::apps::run_converge(converge);
    if (app.got_subcommand("plot")) return troupe::apps::run_plot(plot);
    if (app.got_subcommand("keys")) return troupe::apps::run_keys(keys);
    if (bench.what == "checkpoint") return troupe::apps::run_bench_checkpoint(bench);
    if (bench.what == "pipeline") return troupe::apps::run_bench_pipeline(bench);
    if (bench.what == "transport") return troupe::apps::run_bench_transport(bench);
    if (bench.what == "hop") return troupe::apps::run_bench_hop(bench);
    return troupe::apps::run_bench(bench);
  } catch (const std::bad_alloc& failure) {
    std::fprintf(stderr, "troupe: %s\n", troupe::layers::out_of_memory_message(failure).c_str());
    return 2;
  }
}
