// `troupe bench hop`: what one message between two stages of the in-process engine costs when
// the stages compute (almost) nothing. A model of parameterless flatten blocks runs with one
// key in flight (max_active_keys = 1), so every hop lies on the critical path, once in one
// stage and once cut into S stages, in alternating rounds; the difference per extra hop is the
// engine's cost of a message: encode, ZeroMQ, receive and decode, the actor mailbox and every
// thread wake-up on the way. The single-thread costs of the message's steps are timed beside
// it, so what remains is the cost of handing the message between threads.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/job_data.h"
#include "actors/engine/run_reports.h"
#include "actors/hosts/pipeline_host.h"
#include "actors/hosts/wire_format.h"
#include "apps/cli/commands.h"
#include "apps/cli/progress.h"
#include "apps/cli/run_output.h"
#include "apps/lab/statistics.h"
#include "layers/backend_registry.h"
#include "transport/endpoint.h"

namespace troupe::apps {
namespace {

const int rounds = 5;
const int pipeline_stages = 4;
/// Samples of the synthetic training set; the run cycles over it (epochs) until its steps.
const int64_t epoch_steps = 100;

/// One payload the benchmark sends: a key of `batch` samples of `width` floats.
struct payload_size {
  const char* name;
  int64_t batch;
  int64_t width;
};

const std::vector<payload_size> payload_sizes = {{"small", 64, 1024}, {"tiny", 1, 16}};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// `stages` stages of flatten blocks (which only reshape) with one key in flight.
actors::job_config hop_job(const payload_size& size, int stages, int64_t steps) {
  actors::job_config config;
  config.model.input_shape = {size.width};
  for (int s = 0; s < pipeline_stages; ++s) {
    layers::layer_spec flatten;
    flatten.type = "flatten";
    config.model.layers.push_back(flatten);
  }
  config.data.dataset = actors::dataset_kind::synthetic;
  config.data.classes = static_cast<int>(size.width);
  config.data.synthetic_train = epoch_steps * size.batch;
  config.data.synthetic_test = size.batch;
  config.data.normalize = false;
  config.parallelism.stages = stages;
  config.parallelism.partition = "uniform";
  config.parallelism.mode = actors::pipeline_mode::async;
  config.parallelism.max_active_keys = 1;
  config.parallelism.min_update_interval = 1;
  config.training.batch_size = size.batch;
  config.training.optimizer = layers::optimizer_kind::sgd;
  config.training.epochs = (steps + epoch_steps - 1) / epoch_steps;
  config.training.max_steps = steps;
  config.metrics.log_interval = 0;
  config.metrics.progress = false;
  return config;
}

/// Seconds per training step of `config` on the engine (evaluations left out); 0 on failure.
double seconds_per_step(const actors::job_config& config, const actors::job_data& data) {
  std::string error;
  actors::quiet_observer observer;
  steady_clock_source clock;
  auto report = actors::run_pipeline(config, data, observer, clock, {}, &error);
  if (!report || report->summary.samples_per_s <= 0) {
    std::fprintf(stderr, "troupe: %s\n", error.c_str());
    return 0;
  }
  return static_cast<double>(config.training.batch_size) / report->summary.samples_per_s;
}

/// Median seconds of the steps of one message, each timed alone on this thread.
struct message_steps {
  double to_wire = 0;        ///< key message to frames
  double send = 0;           ///< validate, encode the header, queue on ZeroMQ
  double receive = 0;        ///< take from ZeroMQ, decode and validate the header and frames
  double key_from_wire = 0;  ///< frames to a key message (the payload copied into a tensor)
};

message_steps time_message_steps(const payload_size& size, int repeats) {
  std::string error;
  auto device = layers::create_backend("cpu", 1, &error);
  transport::transport_context context;
  const std::string address = "inproc://troupe-bench-hop/steps";
  auto in = transport::inbox::bind(context, address, {}, nullptr);
  auto out = transport::outbox::connect(context, address, {}, nullptr);
  actors::key_message message;
  message.kind = actors::key_kind::backward;
  message.payload =
      layers::tensor::filled(*device, device->default_stream(), {size.batch, size.width}, 1.0f);
  std::vector<double> to_wire, send, receive, key_from_wire;
  for (int i = 0; i < repeats; ++i) {
    message.key = static_cast<uint64_t>(i);
    auto start = std::chrono::steady_clock::now();
    const transport::message wire = actors::to_wire(message, actors::wire_route{});
    to_wire.push_back(seconds_since(start));
    start = std::chrono::steady_clock::now();
    // The first send waits for ZeroMQ to finish connecting; the median leaves it out.
    const transport::send_result sent = out->send_waiting(wire, std::chrono::milliseconds(1000));
    send.push_back(seconds_since(start));
    start = std::chrono::steady_clock::now();
    auto received = in->try_receive();
    receive.push_back(seconds_since(start));
    if (!sent.ok() || !received || !received->ok()) {
      std::fprintf(stderr, "troupe: a message went missing: %s\n", sent.detail.c_str());
      return {};
    }
    start = std::chrono::steady_clock::now();
    auto decoded = actors::key_from_wire(*received->value, *device, &error);
    key_from_wire.push_back(seconds_since(start));
    if (!decoded) std::fprintf(stderr, "troupe: %s\n", error.c_str());
  }
  return {median(to_wire), median(send), median(receive), median(key_from_wire)};
}

/// The figures of one payload size.
struct hop_figures {
  double one_stage_step_s = 0;
  double pipeline_step_s = 0;
  double hop_s = 0;
  message_steps steps;
};

hop_figures measure(const payload_size& size, int64_t steps) {
  std::string error;
  const actors::job_config one = hop_job(size, 1, steps);
  const actors::job_config many = hop_job(size, pipeline_stages, steps);
  auto data = actors::load_job_data(one, &error);
  if (!data) {
    std::fprintf(stderr, "troupe: %s\n", error.c_str());
    return {};
  }
  // Each key crosses every cut forwards and backwards.
  const int extra_hops = 2 * (pipeline_stages - 1);
  std::vector<double> one_stage, pipeline, hop;
  for (int r = 0; r < rounds; ++r) {
    one_stage.push_back(seconds_per_step(one, *data));
    pipeline.push_back(seconds_per_step(many, *data));
    hop.push_back((pipeline.back() - one_stage.back()) / extra_hops);
  }
  return {median(one_stage), median(pipeline), median(hop), time_message_steps(size, 2000)};
}

void print_figures(const payload_size& size, const hop_figures& f) {
  const double in_thread = f.steps.to_wire + f.steps.send + f.steps.receive + f.steps.key_from_wire;
  std::printf("  %s payload, %lldx%lld floats (%lld bytes):\n", size.name,
              static_cast<long long>(size.batch), static_cast<long long>(size.width),
              static_cast<long long>(size.batch * size.width * 4));
  std::printf("    step: 1 stage %.1f us, %d stages %.1f us (median of %d rounds)\n",
              f.one_stage_step_s * 1e6, pipeline_stages, f.pipeline_step_s * 1e6, rounds);
  std::printf("    hop: %.1f us per message between two stages\n", f.hop_s * 1e6);
  std::printf(
      "    of which on one thread: to_wire %.1f, send %.1f, receive+decode %.1f, "
      "key_from_wire %.1f = %.1f us\n",
      f.steps.to_wire * 1e6, f.steps.send * 1e6, f.steps.receive * 1e6, f.steps.key_from_wire * 1e6,
      in_thread * 1e6);
  std::printf("    rest (thread hand-offs and wake-ups, mailbox, stage handler): %.1f us\n",
              (f.hop_s - in_thread) * 1e6);
}

nlohmann::json to_json(const payload_size& size, const hop_figures& f) {
  return {{"batch", size.batch},
          {"width", size.width},
          {"one_stage_step_s", f.one_stage_step_s},
          {"pipeline_step_s", f.pipeline_step_s},
          {"hop_s", f.hop_s},
          {"to_wire_s", f.steps.to_wire},
          {"send_s", f.steps.send},
          {"receive_s", f.steps.receive},
          {"key_from_wire_s", f.steps.key_from_wire}};
}

}  // namespace

int run_bench_hop(const bench_options& options) {
  // Each size gets about half of --seconds over its rounds; a 4-stage step takes ~0.5 ms.
  const int64_t steps =
      std::max<int64_t>(epoch_steps, static_cast<int64_t>(options.seconds * 200 / rounds));
  std::printf(
      "troupe bench hop: %d flatten blocks in 1 stage and in %d stages, one key in flight, "
      "%lld steps per run\n",
      pipeline_stages, pipeline_stages, static_cast<long long>(steps));
  nlohmann::json result = {{"stages", pipeline_stages}, {"steps", steps}};
  for (const payload_size& size : payload_sizes) {
    const hop_figures figures = measure(size, steps);
    if (figures.hop_s == 0) return 1;
    print_figures(size, figures);
    result[size.name] = to_json(size, figures);
  }
  if (!options.json_file.empty()) return write_json_output(options.json_file, result);
  return 0;
}

}  // namespace troupe::apps
