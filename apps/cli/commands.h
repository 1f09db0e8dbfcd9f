#pragma once

// The subcommands of `troupe`. Each returns the process exit status: 0 on success, 2 on bad
// input (job file, command line, data files), 1 on a failure while running.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "transport/curve.h"

namespace troupe::apps {

struct train_options {
  std::string job_file;
  std::vector<std::string> overrides;
  std::string out_directory;  ///< empty: runs/<job file name>
  bool quiet = false;
  /// Worker processes: with `listen` empty, `workers` local processes are started over
  /// ipc://; with `listen` set (`troupe coordinator`), that many workers are awaited there.
  int workers = 0;
  std::string listen;
  /// Seconds of silence after which a worker counts as dead.
  double heartbeat_timeout_s = 10.0;
  /// CURVE: a directory with this node's NAME.key/NAME.pub and every node's .pub (empty:
  /// no encryption, which only loopback addresses accept unless `insecure`).
  std::string keys_directory;
  std::string key_name = "coordinator";
  bool insecure = false;
  /// --resume [PATH]: continue from PATH (a checkpoint, a checkpoints directory or a run's
  /// output directory), or from the job's own checkpoints when PATH is empty.
  bool resume = false;
  std::string resume_path;
  /// --dashboard [HOST:PORT]: serve the live dashboard (address empty: the default).
  bool dashboard = false;
  std::string dashboard_address;
  std::string dashboard_token;
};

int run_train(const train_options& options);

struct dashboard_options {
  std::string run_directory;
  std::string address;  ///< empty: 127.0.0.1:8265
  std::string token;
};

/// troupe dashboard RUN_DIR: serves a run's (or a simulation's) output directory until stopped.
int run_dashboard(const dashboard_options& options);

struct worker_command_options {
  std::string coordinator;
  std::string listen = "tcp://127.0.0.1:*";
  /// Seconds of silence after which the coordinator counts as gone.
  double heartbeat_timeout_s = 10.0;
  std::string keys_directory;
  std::string key_name;  ///< empty: this host's name
  std::string coordinator_key_name = "coordinator";
  bool insecure = false;
  std::string job_hash;  ///< the job this worker was started for (empty: any)
};

/// `troupe worker`: joins a coordinator and hosts the stages it assigns.
int run_worker_command(const worker_command_options& options);

struct keygen_options {
  std::string directory;
  std::string name;  ///< empty: this host's name
};

/// `troupe keygen DIR`: writes a CURVE key pair NAME.key (secret) and NAME.pub.
int run_keygen(const keygen_options& options);

struct launch_options {
  train_options train;
  /// The coordinator's port when the launcher names none.
  int default_port = 29500;
  /// This rank's key name (empty: "coordinator" on rank 0, the host name elsewhere).
  std::string worker_key_name;
};

/// CURVE settings from a key directory (plain, with `insecure` as given, when it is empty).
std::optional<transport::security_settings> security_from(const std::string& directory,
                                                          const std::string& name, bool insecure,
                                                          std::string* error);

/// The public key in DIRECTORY/NAME.pub.
std::optional<std::string> public_key_named(const std::string& directory, const std::string& name,
                                            std::string* error);

struct simulate_options {
  std::string job_file;
  std::string cluster_file;
  std::vector<std::string> overrides;
  /// "NAME:KEY=VALUE[,KEY=VALUE...]": a simulation of the job with these overrides, one table
  /// row each (before the sweep's).
  std::vector<std::string> settings;
  /// KEY=V1,V2,...: one simulation per value, one table row each.
  std::string sweep;
  std::string out_directory;  ///< empty: runs/simulation
  bool numerics = false;
  uint64_t seed = 1;
  std::vector<std::string> stragglers;    ///< DEVICE=SLOWDOWN[@PROBABILITY]
  std::vector<std::string> degradations;  ///< LINK=FACTOR@START-END
  std::vector<std::string> failures;      ///< DEVICE@SECONDS
  double heartbeat_timeout_s = 10;        ///< from a worker's death to its detection
  double restart_s = 2;                   ///< from the detection to the replacement joining
  /// A `troupe calibrate` profile: measured block costs, and its ipc:// latency and bandwidth
  /// for every device port of the cluster.
  std::string profile_file;
};

/// `troupe simulate JOB --cluster FILE`: the job in virtual time on a modelled cluster.
int run_simulate(const simulate_options& options);

struct calibrate_options {
  std::string job_file;
  std::vector<std::string> overrides;
  std::string out_file;
  double seconds = 0.3;  ///< per block
};

struct validate_options {
  std::string job_file;
  std::vector<std::string> overrides;
  std::string out_directory;         ///< empty: runs/validate
  int steps = 300;                   ///< optimizer steps of every real run
  int runs = 5;                      ///< real runs per configuration; the row quotes their median
  double seconds = 0.2;              ///< calibration time per block
  std::vector<int> stages{1, 2, 4};  ///< pipeline depths validated
  std::vector<int> replicas{1};      ///< replica counts validated, each with every depth
};

/// `troupe validate JOB`: real runs against the simulator's predictions, side by side.
int run_validate(const validate_options& options);

struct converge_options {
  std::string job_file;
  std::vector<std::string> overrides;  ///< for every setting
  /// "NAME:KEY=VALUE[,KEY=VALUE...]": a setting to race, each run with every seed.
  std::vector<std::string> settings;
  std::string sweep;          ///< "KEY=V1,V2": a setting per value
  int seeds = 3;              ///< training.seed = 1 ... seeds
  std::string out_directory;  ///< empty: runs/converge
  std::string profile_file;   ///< empty: calibrate here first
  double seconds = 0.2;       ///< calibration time per block
  bool predict = true;        ///< simulate every run beside it
};

/// `troupe converge JOB`: time to training.target_accuracy of several settings × seeds, real
/// and predicted.
int run_converge(const converge_options& options);

struct dataset_options {
  std::string job_file;
  std::vector<std::string> overrides;
  std::string out_directory;
};

/// `troupe dataset JOB --out DIR`: writes the training and test instances of a graph model's
/// job (listops: train.tsv and test.tsv, label<TAB>expression; text-records: train.jsonl and
/// test.jsonl, one {"tokens", "labels"} object a line) and its resolved config.json.
int run_dataset(const dataset_options& options);

/// `troupe calibrate JOB --out PROFILE`: times the job's blocks and the ipc:// transport here.
int run_calibrate(const calibrate_options& options);

/// `troupe launch JOB`: run by every rank of srun, mpirun, torchrun or a hostfile; rank 0
/// coordinates, the others are workers.
int run_launch(const launch_options& options);

struct bench_options {
  std::string what = "compute";
  std::string device = "cpu";
  std::string precision = "fp32";  ///< GEMM precision (training.precision) of compute, pipeline
  std::string json_file;
  int threads = 0;
  double seconds = 10.0;  ///< time spent on each measurement, over all rounds
};

int run_bench(const bench_options& options);

/// `troupe bench pipeline`: pipelined against single-stage throughput, hand-off cost, memory.
int run_bench_pipeline(const bench_options& options);

/// `troupe bench transport`: troupe frames against raw ZeroMQ between two processes over
/// loopback tcp, with CURVE off and on, and small-message round-trip latency.
int run_bench_transport(const bench_options& options);

/// `troupe bench hop`: microseconds per message between two stages of the in-process engine.
int run_bench_hop(const bench_options& options);

/// `troupe bench checkpoint`: save and load time and MB/s of checkpoint shards, for the MLP
/// example and for a model of over 200 million parameters.
int run_bench_checkpoint(const bench_options& options);

struct inspect_options {
  std::string path;  ///< a step directory, a checkpoints directory or a run's output directory
};

/// `troupe inspect PATH`: prints a checkpoint's manifest and verifies every shard.
int run_inspect(const inspect_options& options);

struct export_options {
  std::string checkpoint;  ///< a step directory (or anything `troupe inspect` accepts)
  std::string format = "safetensors";
  std::string out;
  bool initial = false;  ///< `checkpoint` is a job file: export the weights it starts from
  std::vector<std::string> overrides;  ///< --set, with initial
};

/// `troupe export CHECKPOINT --format safetensors OUT`: writes the model's weights.
int run_export(const export_options& options);

struct generate_options {
  std::string weights;   ///< a checkpoint (anything `troupe inspect` takes) or a .safetensors file
  std::string job_file;  ///< the job of the weights (default: the run's config.json)
  std::string prompt;
  int64_t tokens = 200;
  double temperature = 0.8;
  uint64_t seed = 1;
};

/// `troupe generate CHECKPOINT --prompt TEXT`: samples text from a language model.
int run_generate(const generate_options& options);

struct keys_options {
  bool markdown = false;  ///< docs/guide/job-file.md's Markdown instead of plain text
  std::string section;    ///< only this section (empty: every section and the layer types)
};

/// `troupe keys [SECTION]`: every job-file key with its default and description.
int run_keys(const keys_options& options);

struct plot_options {
  std::vector<std::string> run_directories;
  std::string out_directory;
  std::vector<std::string> labels;  ///< legend labels, one per run (empty: the directory names)
  std::string window;  ///< "START:END" seconds from the trace's start (empty: the last 2 trained)
};

/// `troupe plot RUN_DIR... --out DIR`: PNG and SVG figures of the runs overlaid, drawn by
/// apps/plot/troupe_plot.py with python3-matplotlib; returns the script's exit status (1 when
/// python3 or matplotlib is missing).
int run_plot(const plot_options& options);

}  // namespace troupe::apps
