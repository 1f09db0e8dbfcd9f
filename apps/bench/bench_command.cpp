// `troupe bench compute`: the backend's practical GEMM peak, the GEMMs of each linear layer of
// the example MLP, and end-to-end training throughput as a fraction of that peak, all at the
// GEMM precision of --precision. Peak and training are measured in alternating rounds of one
// run, so a machine that drifts between fast and slow states affects both alike. On a GPU it
// also trains the wide MLP of apps/bench/pytorch_mlp.py, for a like-for-like comparison with
// PyTorch.

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/engine/sequential_trainer.h"
#include "apps/bench/bench_models.h"
#include "apps/cli/commands.h"
#include "apps/cli/run_output.h"
#include "apps/lab/statistics.h"
#include "layers/backend_registry.h"
#include "layers/gemm_precision.h"
#include "layers/random.h"

namespace troupe::apps {
namespace {

const std::vector<int> mlp_widths = {784, 1024, 1024, 1024, 10};
/// The model and batch of apps/bench/pytorch_mlp.py (GPU only: a step is 1.3 TFLOP).
const std::vector<int> comparison_widths = {784, 8192, 8192, 8192, 8192, 10};
const int64_t comparison_batch = 1024;
const int rounds = 5;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Runs `work` (which enqueues on `s`) repeatedly for about `budget` seconds, after one warm-up
/// call, synchronizing after every `queued` calls; returns the mean seconds per call. With
/// queued > 1 a GPU's launches queue up back to back, as they do in training and in cuBLAS's own
/// timing, instead of each paying for a round trip.
double time_per_call(layers::backend& device, layers::stream s, double budget,
                     const std::function<void()>& work, int queued = 1) {
  work();
  device.synchronize(s);
  int calls = 0;
  const auto start = std::chrono::steady_clock::now();
  do {
    for (int i = 0; i < queued; ++i) work();
    calls += queued;
    device.synchronize(s);
  } while (seconds_since(start) < budget);
  return seconds_since(start) / calls;
}

layers::tensor random_tensor(layers::backend& device, layers::shape dims, uint64_t seed) {
  layers::random_generator generator(seed);
  std::vector<float> values(layers::element_count(dims));
  for (float& v : values) v = generator.uniform(-1.0f, 1.0f);
  return layers::tensor::from_host(device, device.default_stream(), dims, values);
}

/// GFLOP/s of C[m×n] = op(A) op(B) with inner dimension k, on stream `s` (and its precision).
double gemm_gflops(layers::backend& device, layers::stream s, layers::transpose ta,
                   layers::transpose tb, int m, int n, int k, double budget) {
  auto a = random_tensor(device, {m, k}, 1);
  auto b = random_tensor(device, {k, n}, 2);
  layers::tensor c(device, {m, n});
  const int lda = ta == layers::transpose::no ? k : m;
  const int ldb = tb == layers::transpose::no ? n : k;
  const int queued = device.kind() == layers::device_kind::cpu ? 1 : 20;
  const double seconds = time_per_call(
      device, s, budget,
      [&] {
        device.gemm(s, ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), n);
      },
      queued);
  return 2.0 * m * n * k / seconds / 1e9;
}

/// GFLOP/s of a 2048³ sgemm called straight into OpenBLAS with its own `threads` threads, the
/// way most programs use it; the backend instead splits GEMMs over its pool itself.
double openblas_threaded_gflops(layers::backend& device, int threads, double budget) {
  const int size = 2048;
  auto a = random_tensor(device, {size, size}, 1);
  auto b = random_tensor(device, {size, size}, 2);
  layers::tensor c(device, {size, size});
  openblas_set_num_threads(threads);
  const double seconds = time_per_call(device, device.default_stream(), budget, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, size, size, size, 1.0f, a.data(), size,
                b.data(), size, 0.0f, c.data(), size);
  });
  openblas_set_num_threads(1);
  return 2.0 * size * size * size / seconds / 1e9;
}

/// GEMM flops of one training step of the MLP of `widths`: forward, weight gradients, and input
/// gradients of every layer but the first (whose input gradient is never computed).
double training_flops(const std::vector<int>& widths, int64_t batch) {
  double flops = 0;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const double gemm = 2.0 * batch * widths[i] * widths[i + 1];
    flops += (i == 0 ? 2.0 : 3.0) * gemm;
  }
  return flops;
}

/// The job of the MLP of `widths` at batch `batch` and GEMM precision `precision`.
actors::job_config probe_job(const std::vector<int>& widths, int64_t batch,
                             const std::string& precision) {
  actors::job_config config = mlp_job(widths, batch);
  config.training.precision = *layers::math_precision_named(precision);
  return config;
}

struct training_probe {
  int64_t batch;
  std::unique_ptr<actors::sequential_trainer> trainer;
  std::vector<float> features;
  std::vector<int32_t> labels;
  int64_t step = 0;

  training_probe(layers::backend& device, const std::vector<int>& widths, int64_t b,
                 const std::string& precision)
      : batch(b),
        trainer(
            std::make_unique<actors::sequential_trainer>(probe_job(widths, b, precision), device)) {
    layers::random_generator generator(7);
    features.resize(batch * widths.front());
    for (float& v : features) v = generator.uniform(-1.0f, 1.0f);
    for (int64_t i = 0; i < batch; ++i) labels.push_back(static_cast<int32_t>(i % 10));
  }

  /// Samples per second of whole training steps (upload, forward, loss, backward, update, and
  /// the loss read back).
  double samples_per_second(layers::backend& device, double budget) {
    const double seconds = time_per_call(device, trainer->work_stream(), budget, [&] {
      trainer->train_step(features.data(), labels.data(), batch, step++, 0.001f);
    });
    return batch / seconds;
  }
};

/// One GEMM of a linear layer: its shape and operands' transposes.
struct layer_gemm {
  const char* name;
  layers::transpose ta, tb;
  int m, n, k;
};

/// The GEMM's GFLOP/s through the backend and, on a GPU, cuBLAS's best for the same shape and
/// precision (the fastest algorithm cuBLASLt proposes), into `entry`.
void measure_layer_gemm(layers::backend& device, layers::stream s, layers::math_precision precision,
                        const layer_gemm& g, double budget, nlohmann::json& entry) {
  using layers::transpose;
  auto a = random_tensor(
      device, g.ta == transpose::no ? layers::shape{g.m, g.k} : layers::shape{g.k, g.m}, 1);
  auto b = random_tensor(
      device, g.tb == transpose::no ? layers::shape{g.k, g.n} : layers::shape{g.n, g.k}, 2);
  layers::tensor c(device, {g.m, g.n});
  const int lda = g.ta == transpose::no ? g.k : g.m;
  const int ldb = g.tb == transpose::no ? g.n : g.k;
  const bool on_cpu = device.kind() == layers::device_kind::cpu;
  const double seconds = time_per_call(
      device, s, budget,
      [&] {
        device.gemm(s, g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                    c.data(), g.n);
      },
      on_cpu ? 1 : 20);
  const double flops = 2.0 * g.m * g.n * g.k;
  entry[std::string(g.name) + "_gflops"] = flops / seconds / 1e9;
  const auto best = layers::best_library_gemm(device, s, precision, g.ta, g.tb, g.m, g.n, g.k,
                                              a.data(), lda, b.data(), ldb, c.data(), g.n, 20);
  if (!best || best->seconds <= 0) return;
  entry[std::string(g.name) + "_cublas_best_gflops"] = flops / best->seconds / 1e9;
  entry[std::string(g.name) + "_fraction_of_cublas_best"] = best->seconds / seconds;
  entry[std::string(g.name) + "_cublas_algorithms"] = best->algorithms;
}

/// Every GEMM of the linear layers of the MLP of `widths` at `batch`: forward, weight
/// gradient and input gradient, as the layers call them.
nlohmann::json layer_gemms(layers::backend& device, layers::stream s,
                           layers::math_precision precision, const std::vector<int>& widths,
                           int64_t batch, double budget) {
  using layers::transpose;
  nlohmann::json layers_json = nlohmann::json::array();
  const int b = static_cast<int>(batch);
  const bool on_cpu = device.kind() == layers::device_kind::cpu;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const int in = widths[i], out = widths[i + 1];
    nlohmann::json entry = {{"layer", "linear " + std::to_string(in) + "x" + std::to_string(out)},
                            {"batch", batch}};
    const layer_gemm gemms[] = {{"forward", transpose::no, transpose::yes, b, out, in},
                                {"weight_gradient", transpose::yes, transpose::no, out, in, b},
                                {"input_gradient", transpose::no, transpose::no, b, in, out}};
    for (const layer_gemm& g : gemms) measure_layer_gemm(device, s, precision, g, budget, entry);
    const double unit = on_cpu ? 1.0 : 1e-3;  // GFLOP/s on a CPU, TFLOP/s on a GPU
    std::printf("  %-22s batch %4lld  forward %7.1f  weight-grad %7.1f  input-grad %7.1f %s\n",
                entry["layer"].get<std::string>().c_str(), static_cast<long long>(batch),
                unit * entry["forward_gflops"].get<double>(),
                unit * entry["weight_gradient_gflops"].get<double>(),
                unit * entry["input_gradient_gflops"].get<double>(),
                on_cpu ? "GFLOP/s" : "TFLOP/s");
    if (entry.contains("forward_cublas_best_gflops"))
      std::printf(
          "  %-22s  cuBLAS's best:  %7.1f              %7.1f              %7.1f TFLOP/s"
          "  (troupe: %.0f%% %.0f%% %.0f%% of it)\n",
          "", 1e-3 * entry["forward_cublas_best_gflops"].get<double>(),
          1e-3 * entry["weight_gradient_cublas_best_gflops"].get<double>(),
          1e-3 * entry["input_gradient_cublas_best_gflops"].get<double>(),
          100 * entry["forward_fraction_of_cublas_best"].get<double>(),
          100 * entry["weight_gradient_fraction_of_cublas_best"].get<double>(),
          100 * entry["input_gradient_fraction_of_cublas_best"].get<double>());
    layers_json.push_back(entry);
  }
  return layers_json;
}

/// Trains the model of apps/bench/pytorch_mlp.py for `rounds` × `budget` seconds and prints
/// the line that script prints, with troupe's figure.
nlohmann::json comparison_training(layers::backend& device, const std::string& precision,
                                   double budget) {
  training_probe wide(device, comparison_widths, comparison_batch, precision);
  std::vector<double> rates;
  for (int round = 0; round < rounds; ++round)
    rates.push_back(wide.samples_per_second(device, budget));
  const double samples = median(rates);
  const double tflops =
      samples * training_flops(comparison_widths, comparison_batch) / comparison_batch / 1e12;
  std::printf("the MLP of apps/bench/pytorch_mlp.py (784-8192x4-10, batch %lld): %.1f TFLOP/s\n",
              static_cast<long long>(comparison_batch), tflops);
  std::printf("troupe_mlp precision=%s samples_per_s=%.1f\n", precision.c_str(), samples);
  return {{"widths", comparison_widths},
          {"batch", comparison_batch},
          {"samples_per_s", samples},
          {"tflops", tflops}};
}

}  // namespace

int run_bench(const bench_options& options) {
  std::string error;
  auto device = layers::create_backend(options.device, options.threads, &error);
  if (!device) {
    std::fprintf(stderr, "troupe: --device: %s\n", error.c_str());
    return 2;
  }
  const auto precision = layers::math_precision_named(options.precision);
  if (!precision) {
    std::fprintf(stderr, "troupe: --precision: unknown precision '%s'\n",
                 options.precision.c_str());
    return 2;
  }
  const double budget = options.seconds / rounds;
  std::printf("troupe bench compute on %s, %s GEMMs (%d rounds of %.2f s per figure)\n",
              device->name().c_str(), options.precision.c_str(), rounds, budget);
  const layers::stream work = device->create_stream();
  device->set_gemm_precision(work, *precision);
  training_probe small(*device, mlp_widths, 64, options.precision),
      large(*device, mlp_widths, 256, options.precision);
  const bool on_cpu = device->kind() == layers::device_kind::cpu;
  const int cpu_threads =
      options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  std::vector<double> peaks, openblas_peaks, small_rates, large_rates;
  for (int round = 0; round < rounds; ++round) {
    peaks.push_back(gemm_gflops(*device, work, layers::transpose::no, layers::transpose::no, 2048,
                                2048, 2048, budget));
    if (on_cpu) openblas_peaks.push_back(openblas_threaded_gflops(*device, cpu_threads, budget));
    small_rates.push_back(small.samples_per_second(*device, budget));
    large_rates.push_back(large.samples_per_second(*device, budget));
  }
  double peak = median(peaks);
  std::printf(
      "GEMM 2048x2048x2048 (%s) through the backend: %.1f GFLOP/s (median of %d; min %.1f, "
      "max %.1f)\n",
      options.precision.c_str(), peak, rounds, *std::min_element(peaks.begin(), peaks.end()),
      *std::max_element(peaks.begin(), peaks.end()));
  nlohmann::json result = {{"device", device->name()},
                           {"precision", options.precision},
                           {"backend_sgemm_2048_gflops", peak}};
  if (on_cpu) {
    const double openblas = median(openblas_peaks);
    std::printf("sgemm 2048x2048x2048 with OpenBLAS's own %d threads: %.1f GFLOP/s\n", cpu_threads,
                openblas);
    result["openblas_threaded_sgemm_2048_gflops"] = openblas;
    peak = std::max(peak, openblas);
  }
  std::printf("peak (the higher of the two): %.1f GFLOP/s\n", peak);
  result["sgemm_2048_gflops"] = peak;
  if (on_cpu) {
    std::printf("linear-layer GEMMs of the MLP 784-1024-1024-1024-10:\n");
    result["layers"] = layer_gemms(*device, work, *precision, mlp_widths, 64, budget / 2);
    for (auto& entry : layer_gemms(*device, work, *precision, mlp_widths, 256, budget / 2))
      result["layers"].push_back(entry);
  } else {
    std::printf(
        "linear-layer GEMMs of the MLP 784-8192x4-10 against cuBLAS's best for each shape:\n");
    result["layers"] =
        layer_gemms(*device, work, *precision, comparison_widths, comparison_batch, budget / 2);
  }
  nlohmann::json training = nlohmann::json::array();
  std::printf("end-to-end MLP training (SGD with momentum, whole steps):\n");
  for (auto* rates : {&small_rates, &large_rates}) {
    const int64_t batch = rates == &small_rates ? 64 : 256;
    const double samples = median(*rates);
    const double gflops = samples * training_flops(mlp_widths, batch) / batch / 1e9;
    std::printf(
        "  batch %4lld: %8.0f samples/s  %6.1f GFLOP/s  = %.1f%% of sgemm peak"
        "  (rounds: %.0f to %.0f samples/s)\n",
        static_cast<long long>(batch), samples, gflops, 100.0 * gflops / peak,
        *std::min_element(rates->begin(), rates->end()),
        *std::max_element(rates->begin(), rates->end()));
    training.push_back({{"batch", batch},
                        {"samples_per_s", samples},
                        {"gflops", gflops},
                        {"fraction_of_peak", gflops / peak}});
  }
  result["training"] = training;
  if (!on_cpu)
    result["pytorch_comparison"] = comparison_training(*device, options.precision, budget);
  device->destroy_stream(work);
  if (!options.json_file.empty()) {
    if (write_json_output(options.json_file, result) != 0) return 1;
  }
  return 0;
}

}  // namespace troupe::apps
