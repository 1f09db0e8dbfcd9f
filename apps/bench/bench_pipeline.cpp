// `troupe bench pipeline`: what pipelining costs and buys on this machine, measured side by
// side in one run: a compute-bound MLP trained in one stage and in a 2-stage async pipeline
// (one core per stage on the CPU), sync GPipe against its ideal bubble bound, the ZeroMQ
// hand-off of one activation against a training step, and peak resident memory; GEMMs at
// --precision. On a GPU the MLP is the wide one of apps/bench/pytorch_mlp.py, and the stages
// share the one device on streams of their own: 2 and 4 stages in one process, and 2 stages in
// two worker processes (--workers 2), each against the same model in one stage.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "actors/config/job_data.h"
#include "actors/engine/run_reports.h"
#include "actors/hosts/pipeline_host.h"
#include "actors/hosts/wire_format.h"
#include "apps/bench/bench_models.h"
#include "apps/cli/child_train.h"
#include "apps/cli/commands.h"
#include "apps/cli/progress.h"
#include "apps/cli/run_output.h"
#include "layers/backend_registry.h"
#include "layers/gemm_precision.h"
#include "transport/endpoint.h"

namespace troupe::apps {
namespace {

const std::vector<int> cpu_widths = {784, 2048, 2048, 2048, 2048, 2048, 10};
const int64_t cpu_batch = 64;
/// The model and batch of apps/bench/pytorch_mlp.py: a GPU's stages need work this size.
const std::vector<int> gpu_widths = {784, 8192, 8192, 8192, 8192, 10};
const int64_t gpu_batch = 1024;

/// The device and precision every run of the benchmark uses.
struct bench_target {
  std::string device;
  std::string precision;
  bool on_cpu() const { return device == "cpu"; }
  const std::vector<int>& widths() const { return on_cpu() ? cpu_widths : gpu_widths; }
  int64_t batch() const { return on_cpu() ? cpu_batch : gpu_batch; }
};

std::string widths_text(const std::vector<int>& widths) {
  std::string text;
  for (int width : widths) text += (text.empty() ? "" : "-") + std::to_string(width);
  return text;
}

actors::job_config wide_mlp(int64_t steps, const bench_target& target) {
  actors::job_config config = mlp_job(target.widths(), target.batch());
  config.parallelism.devices = {target.device};
  config.training.precision = *layers::math_precision_named(target.precision);
  config.data.dataset = actors::dataset_kind::synthetic;
  config.data.synthetic_train = steps * target.batch();
  config.data.synthetic_test = target.batch();
  config.data.normalize = false;
  config.training.max_steps = steps;
  config.metrics.log_interval = 0;
  return config;
}

/// Training samples per second of `config` on the actor engine (one stage included).
double samples_per_second(const actors::job_config& config) {
  std::string error;
  auto data = actors::load_job_data(config, &error);
  actors::quiet_observer observer;
  steady_clock_source clock;
  auto report = actors::run_pipeline(config, *data, observer, clock, {}, &error);
  if (!report) {
    std::fprintf(stderr, "troupe: %s\n", error.c_str());
    return 0;
  }
  return report->summary.samples_per_s;
}

actors::job_config variant(const bench_target& target, int64_t steps, int stages, int threads,
                           actors::pipeline_mode mode, int micro_batches) {
  actors::job_config config = wide_mlp(steps, target);
  config.parallelism.stages = stages;
  config.parallelism.threads = threads;
  config.parallelism.mode = mode;
  config.parallelism.micro_batches = micro_batches;
  config.parallelism.max_active_keys = 2 * stages;
  config.parallelism.min_update_interval = 1;
  return config;
}

/// Seconds to carry one batch-64 activation of the MLP from one stage to another: encode
/// (on a GPU, the copy into a pinned buffer), send over inproc ZeroMQ, receive, decode into a
/// tensor (the receiving copy included).
double handoff_seconds(const bench_target& target, int repeats) {
  std::string error;
  auto device = layers::create_backend(target.device, 1, &error);
  transport::transport_context context;
  const std::string address = "inproc://troupe-bench/handoff";
  auto in = transport::inbox::bind(context, address, {}, nullptr);
  auto out = transport::outbox::connect(context, address, {}, nullptr);
  actors::key_message message;
  message.kind = actors::key_kind::backward;
  const int64_t width = target.widths()[1];
  message.payload =
      layers::tensor::filled(*device, device->default_stream(), {target.batch(), width}, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) {
    message.key = i;
    const transport::message wire = actors::to_wire(message, actors::wire_route{});
    const auto sent = out->send_waiting(wire, std::chrono::milliseconds(1000));
    auto received = in->receive(std::chrono::milliseconds(1000));
    if (!sent.ok() || !received || !received->ok()) {
      std::fprintf(stderr, "troupe: hand-off failed: %s %s\n", sent.detail.c_str(),
                   received ? received->error.text.c_str() : "nothing received");
      return -1;
    }
    auto decoded = actors::key_from_wire(*received->value, *device, &error);
    if (!decoded) {
      std::fprintf(stderr, "troupe: hand-off failed: %s\n", error.c_str());
      return -1;
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / repeats;
}

double peak_resident_megabytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;
}

/// The CPU figures: one core per stage against one stage on one or both cores.
void print_cpu_figures(double one_core, double two_cores, double async_two, double gpipe_two,
                       int micro, double ideal) {
  std::printf("  1 stage, 1 core:                 %8.0f samples/s\n", one_core);
  std::printf("  1 stage, 2 cores (split GEMMs):  %8.0f samples/s\n", two_cores);
  std::printf(
      "  2-stage async, 1 core per stage: %8.0f samples/s = %.2fx the 1-core stage, "
      "%.2fx the 2-core stage\n",
      async_two, async_two / one_core, async_two / two_cores);
  std::printf(
      "  2-stage sync GPipe, M=%d:         %8.0f samples/s = %.2f of 2x the 1-core stage "
      "(ideal bubble bound M/(M+S-1) = %.2f)\n",
      micro, gpipe_two, gpipe_two / (2 * one_core), ideal);
}

/// The job file of variant(target, steps, stages, .., async, 1), for worker processes, which
/// read their job as TOML.
std::string job_toml(const bench_target& target, int64_t steps, int stages) {
  std::string layers_text;
  const auto& widths = target.widths();
  for (size_t i = 1; i < widths.size(); ++i) {
    layers_text += "  { type = \"linear\", out = " + std::to_string(widths[i]) + " },\n";
    if (i + 1 < widths.size()) layers_text += "  { type = \"relu\" },\n";
  }
  const std::string batch = std::to_string(target.batch());
  return "[model]\ninput_shape = [" + std::to_string(widths.front()) + "]\nlayers = [\n" +
         layers_text + "]\n\n[data]\ndataset = \"synthetic\"\nsynthetic_train = " +
         std::to_string(steps * target.batch()) + "\nsynthetic_test = " + batch +
         "\nnormalize = false\n\n[parallelism]\nstages = " + std::to_string(stages) +
         "\nmode = \"async\"\ndevices = \"" + target.device +
         "\"\nmax_active_keys = " + std::to_string(2 * stages) +
         "\nmin_update_interval = 1\n\n[training]\nbatch_size = " + batch +
         "\noptimizer = \"sgd\"\nmomentum = 0.9\nlr = 0.01\nmax_steps = " + std::to_string(steps) +
         "\nprecision = \"" + target.precision + "\"\n";
}

/// Samples per second of the async pipeline of `stages` stages in as many worker processes
/// on this machine (`troupe train --workers`), run as a process of its own; 0 when it failed.
double workers_samples_per_second(const bench_target& target, int64_t steps, int stages) {
  char pattern[] = "/tmp/troupe-bench-workers-XXXXXX";
  if (mkdtemp(pattern) == nullptr) return 0;
  const std::filesystem::path directory = pattern;
  const std::string job = (directory / "job.toml").string();
  std::ofstream(job) << job_toml(target, steps, stages);
  const auto summary = train_in_child_process(job, {}, stages, (directory / "run").string());
  std::error_code ignored;
  if (!summary) {
    std::fprintf(stderr, "troupe: the --workers %d run failed; its log is %s/run/train.log\n",
                 stages, directory.c_str());
    return 0;
  }
  std::filesystem::remove_all(directory, ignored);
  return summary->value("samples_per_s", 0.0);
}

/// The GPU figures: every stage shares the one device, each on a stream of its own.
struct gpu_figures {
  double one_stage = 0, async_two = 0, async_four = 0, gpipe_two = 0, workers_two = 0;
};

void print_gpu_figures(const gpu_figures& f, int micro) {
  std::printf("  1 stage:                          %8.0f samples/s\n", f.one_stage);
  std::printf("  2-stage async, one GPU shared:    %8.0f samples/s = %.2fx the 1-stage run\n",
              f.async_two, f.async_two / f.one_stage);
  std::printf("  4-stage async, one GPU shared:    %8.0f samples/s = %.2fx the 1-stage run\n",
              f.async_four, f.async_four / f.one_stage);
  std::printf("  2-stage sync GPipe, M=%d:          %8.0f samples/s = %.2fx the 1-stage run\n",
              micro, f.gpipe_two, f.gpipe_two / f.one_stage);
  std::printf("  2-stage async, --workers 2:       %8.0f samples/s = %.2fx the 1-stage run\n",
              f.workers_two, f.workers_two / f.one_stage);
}

}  // namespace

int run_bench_pipeline(const bench_options& options) {
  using actors::pipeline_mode;
  const bench_target target{options.device, options.precision};
  std::string error;
  if (!layers::create_backend(target.device, 1, &error)) {
    std::fprintf(stderr, "troupe: --device: %s\n", error.c_str());
    return 2;
  }
  const int64_t steps = std::max<int64_t>(20, static_cast<int64_t>(options.seconds * 12));
  const bool on_cpu = target.on_cpu();
  std::printf("troupe bench pipeline on %s, %s GEMMs: MLP %s, batch %lld, %lld steps per run\n",
              target.device.c_str(), target.precision.c_str(), widths_text(target.widths()).c_str(),
              static_cast<long long>(target.batch()), static_cast<long long>(steps));
  // On a GPU a short untimed run first loads the kernels and chooses each GEMM shape's
  // algorithm (once per process), so that no timed run pays for it.
  if (!on_cpu) samples_per_second(variant(target, 4, 1, 1, pipeline_mode::sync, 1));
  const double one_core = samples_per_second(variant(target, steps, 1, 1, pipeline_mode::sync, 1));
  // Threads matter to the CPU only: on a GPU the second run would repeat the first.
  const double two_cores =
      on_cpu ? samples_per_second(variant(target, steps, 1, 2, pipeline_mode::sync, 1)) : one_core;
  const double async_two =
      samples_per_second(variant(target, steps, 2, 2, pipeline_mode::async, 1));
  const int micro = 4;
  const double gpipe_two =
      samples_per_second(variant(target, steps, 2, 2, pipeline_mode::sync, micro));
  const double ideal = static_cast<double>(micro) / (micro + 2 - 1);
  gpu_figures gpu;
  if (!on_cpu) {
    gpu = {one_core, async_two,
           samples_per_second(variant(target, steps, 4, 4, pipeline_mode::async, 1)), gpipe_two,
           workers_samples_per_second(target, steps, 2)};
  }
  const double handoff = handoff_seconds(target, 200);
  const double step_seconds = static_cast<double>(target.batch()) / one_core;
  if (on_cpu) {
    print_cpu_figures(one_core, two_cores, async_two, gpipe_two, micro, ideal);
  } else {
    print_gpu_figures(gpu, micro);
  }
  std::printf(
      "  ZeroMQ hand-off of one %lldx%d activation: %.1f us = %.2f%% of a 1-stage step "
      "(%.2f ms)\n",
      static_cast<long long>(target.batch()), target.widths()[1], handoff * 1e6,
      100.0 * handoff / step_seconds, step_seconds * 1e3);
  std::printf("  peak resident memory: %.0f MiB\n", peak_resident_megabytes());
  if (!options.json_file.empty()) {
    nlohmann::json result = {{"device", target.device},
                             {"precision", target.precision},
                             {"model", widths_text(target.widths())},
                             {"batch", target.batch()},
                             {"one_stage_one_core_samples_per_s", one_core},
                             {"one_stage_two_cores_samples_per_s", two_cores},
                             {"two_stage_async_samples_per_s", async_two},
                             {"async_speedup_over_one_core", async_two / one_core},
                             {"two_stage_gpipe_samples_per_s", gpipe_two},
                             {"gpipe_efficiency", gpipe_two / (2 * one_core)},
                             {"gpipe_ideal_bound", ideal},
                             {"handoff_seconds", handoff},
                             {"handoff_fraction_of_step", handoff / step_seconds},
                             {"peak_resident_mib", peak_resident_megabytes()}};
    if (!on_cpu) {
      result["one_stage_samples_per_s"] = gpu.one_stage;
      result["four_stage_async_samples_per_s"] = gpu.async_four;
      result["four_stages_over_one_stage"] = gpu.async_four / gpu.one_stage;
      result["two_stage_async_over_one_stage"] = gpu.async_two / gpu.one_stage;
      result["workers_two_samples_per_s"] = gpu.workers_two;
      result["workers_two_over_one_stage"] = gpu.workers_two / gpu.one_stage;
    }
    if (write_json_output(options.json_file, result) != 0) return 1;
  }
  return 0;
}

}  // namespace troupe::apps
