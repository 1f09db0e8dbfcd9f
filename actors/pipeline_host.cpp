#include "actors/pipeline_host.h"

#include <unistd.h>

#include <atomic>
#include <caf/all.hpp>
#include <cstdio>
#include <thread>

#include "actors/local_pipeline.h"
#include "actors/partition.h"
#include "actors/stage_logic.h"
#include "actors/training_run.h"
#include "actors/wire_format.h"
#include "layers/backend_registry.h"
#include "transport/endpoint.h"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::transport::message)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::stage_report)

namespace troupe::actors {
namespace {

using start_atom = caf::atom_constant<caf::atom("start")>;
using collect_atom = caf::atom_constant<caf::atom("collect")>;
using done_atom = caf::atom_constant<caf::atom("done")>;

/// Far more than max_active_keys messages ever wait on one socket, so a send never finds a
/// full queue; admission, not the socket, bounds memory.
constexpr int high_water_mark = 1 << 14;

transport::endpoint_options endpoint_settings() {
  transport::endpoint_options options;
  options.send_high_water_mark = high_water_mark;
  options.receive_high_water_mark = high_water_mark;
  return options;
}

/// Sends on `out`; a full queue (which admission should make impossible) is waited out
/// rather than dropping a key. Returns false with the reason printed when the send failed.
bool send_on(transport::outbox& out, const transport::message& message) {
  transport::send_result result = out.send(message);
  while (result.status == transport::send_status::would_block) {
    out.wait_writable(std::chrono::milliseconds(100));
    result = out.send(message);
  }
  if (!result.ok()) {
    std::fprintf(stderr, "troupe: send to %s failed: %s\n", out.address().c_str(),
                 result.detail.c_str());
  }
  return result.ok();
}

/// Everything a stage actor owns, made on the main thread and handed over at spawn.
struct stage_parts {
  int index = 0;
  uint64_t job_id = 0;
  std::unique_ptr<layers::backend> backend;
  std::unique_ptr<stage_device> device;
  std::unique_ptr<stage_logic> logic;
  std::optional<transport::outbox> next;
  std::optional<transport::outbox> previous;
  std::optional<transport::outbox> coordinator;
  clock_source* clock = nullptr;
  trace_recorder* trace = nullptr;
  bool collect_weights = false;
};

struct stage_state {
  std::shared_ptr<stage_parts> parts;
};

const char* span_name(key_kind kind, bool last, bool stepped) {
  if (kind == key_kind::evaluate) return "evaluate";
  if (kind == key_kind::forward)
    return last ? (stepped ? "forward+backward+step" : "forward+backward") : "forward";
  return stepped ? "backward+step" : "backward";
}

void send_outputs(stage_parts& parts, std::vector<stage_output>& outputs) {
  for (stage_output& output : outputs) {
    wire_route route{parts.job_id, parts.index, transport::coordinator_stage,
                     parts.logic->version(), parts.clock->now_seconds()};
    switch (output.what) {
      case stage_output::kind::to_next_stage:
        route.target_stage = parts.index + 1;
        send_on(*parts.next, to_wire(output.message, route));
        break;
      case stage_output::kind::to_previous_stage:
        route.target_stage = parts.index - 1;
        send_on(*parts.previous, to_wire(output.message, route));
        break;
      default:
        send_on(*parts.coordinator, report_to_wire(output, route));
        break;
    }
  }
}

void handle_at_stage(stage_parts& parts, const transport::message& incoming) {
  const double start = parts.clock->now_seconds();
  std::string error;
  auto message = key_from_wire(incoming, *parts.backend, &error);
  if (!message) {
    std::fprintf(stderr, "troupe: stage %d dropped a message from stage %d: %s\n", parts.index,
                 incoming.header.source_stage, error.c_str());
    return;
  }
  const int64_t version = parts.logic->version();
  std::vector<stage_output> outputs = parts.logic->handle(*message);
  if (parts.trace) {
    const double end = parts.clock->now_seconds();
    parts.trace->flow(incoming.header.source_stage, parts.index, message->key, sent_time(incoming),
                      start);
    parts.trace->span(
        parts.index,
        span_name(message->kind, parts.logic->is_last(), parts.logic->version() != version),
        static_cast<int64_t>(message->key), start, end - start);
  }
  send_outputs(parts, outputs);
}

stage_report snapshot(stage_parts& parts) {
  stage_report report;
  report.staleness_histogram = parts.logic->staleness_histogram();
  report.weight_staleness_histogram = parts.logic->weight_staleness_histogram();
  report.peak_contexts = parts.logic->peak_contexts();
  report.version = parts.logic->version();
  if (parts.collect_weights) {
    for (layers::parameter* p : parts.device->parameters()) {
      report.weights.push_back(p->value.to_host(parts.backend->default_stream()));
    }
  }
  return report;
}

caf::behavior stage_actor(caf::stateful_actor<stage_state>* self,
                          std::shared_ptr<stage_parts> parts) {
  self->state.parts = std::move(parts);
  return {
      [self](const transport::message& incoming) { handle_at_stage(*self->state.parts, incoming); },
      [self](collect_atom) { return snapshot(*self->state.parts); },
  };
}

/// Everything the coordinator actor owns.
struct coordinator_parts {
  uint64_t job_id = 0;
  std::unique_ptr<layers::backend> host;
  std::unique_ptr<training_run> run;
  std::optional<transport::outbox> first_stage;
  clock_source* clock = nullptr;
  trace_recorder* trace = nullptr;
  caf::actor listener;
};

struct coordinator_state {
  std::shared_ptr<coordinator_parts> parts;
};

void dispatch(coordinator_parts& parts, const std::vector<key_message>& messages) {
  for (const key_message& message : messages) {
    wire_route route{parts.job_id, transport::coordinator_stage, 0, 0, parts.clock->now_seconds()};
    send_on(*parts.first_stage, to_wire(message, route));
  }
}

caf::behavior coordinator_actor(caf::stateful_actor<coordinator_state>* self,
                                std::shared_ptr<coordinator_parts> parts) {
  self->state.parts = std::move(parts);
  return {
      [self](start_atom) {
        coordinator_parts& parts = *self->state.parts;
        dispatch(parts, parts.run->start(parts.clock->now_seconds()));
        if (parts.run->finished()) self->send(parts.listener, done_atom::value);
      },
      [self](const transport::message& incoming) {
        coordinator_parts& parts = *self->state.parts;
        std::string error;
        auto report = report_from_wire(incoming, &error);
        if (!report) {
          std::fprintf(stderr, "troupe: coordinator dropped a message from stage %d: %s\n",
                       incoming.header.source_stage, error.c_str());
          return;
        }
        dispatch(parts, parts.run->handle(*report, parts.clock->now_seconds()));
        if (parts.run->finished()) self->send(parts.listener, done_atom::value);
      },
  };
}

std::string coordinator_address(const std::string& prefix) { return prefix + "/coordinator"; }

/// A job id unique within this machine's running processes.
uint64_t fresh_job_id() {
  static std::atomic<uint64_t> counter{0};
  return (static_cast<uint64_t>(::getpid()) << 20) + counter.fetch_add(1);
}

/// The CPU threads each stage's backend may use: the job's share of the cores, split evenly.
int threads_per_stage(const job_config& config) {
  int total = config.parallelism.threads;
  if (total <= 0) total = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, total / config.parallelism.stages);
}

const std::string& device_of_stage(const job_config& config, int stage) {
  const auto& devices = config.parallelism.devices;
  return devices.size() == 1 ? devices.front() : devices[stage];
}

struct endpoints {
  transport::transport_context context;
  std::string prefix;
  std::vector<transport::inbox> inboxes;  // stages, then the coordinator
};

std::optional<transport::outbox> connect(endpoints& net, const std::string& address,
                                         std::string* error) {
  transport::endpoint_error problem;
  auto out = transport::outbox::connect(net.context, address, endpoint_settings(), &problem);
  if (!out) *error = problem.text;
  return out;
}

bool bind_inboxes(endpoints& net, int stages, std::string* error) {
  for (int s = 0; s <= stages; ++s) {
    const std::string address =
        s < stages ? transport::stage_address(net.prefix, s) : coordinator_address(net.prefix);
    transport::endpoint_error problem;
    auto in = transport::inbox::bind(net.context, address, endpoint_settings(), &problem);
    if (!in) {
      *error = problem.text;
      return false;
    }
    net.inboxes.push_back(std::move(*in));
  }
  return true;
}

std::shared_ptr<stage_parts> make_stage(const job_config& config, const stage_range& range,
                                        int index, int64_t steps_per_epoch, int64_t total_steps,
                                        endpoints& net, std::string* error) {
  auto parts = std::make_shared<stage_parts>();
  parts->index = index;
  parts->backend =
      layers::create_backend(device_of_stage(config, index), threads_per_stage(config), error);
  if (!parts->backend) return nullptr;
  parts->device = make_layers_stage_device(config, range, *parts->backend);
  parts->logic = std::make_unique<stage_logic>(
      stage_settings_of(config, index, steps_per_epoch, total_steps), *parts->device);
  const int stages = config.parallelism.stages;
  if (index + 1 < stages) {
    parts->next = connect(net, transport::stage_address(net.prefix, index + 1), error);
    if (!parts->next) return nullptr;
  }
  if (index > 0) {
    parts->previous = connect(net, transport::stage_address(net.prefix, index - 1), error);
    if (!parts->previous) return nullptr;
  }
  parts->coordinator = connect(net, coordinator_address(net.prefix), error);
  if (!parts->coordinator) return nullptr;
  return parts;
}

}  // namespace

std::optional<pipeline_report> run_pipeline(const job_config& config, const job_data& data,
                                            training_observer& observer, clock_source& clock,
                                            const pipeline_options& options, std::string* error) {
  auto ranges = partition_model(config, error);
  if (!ranges) return std::nullopt;
  const int stages = static_cast<int>(ranges->size());
  endpoints net;
  const uint64_t job_id = fresh_job_id();
  net.prefix = transport::inproc_prefix(job_id);
  if (!bind_inboxes(net, stages, error)) return std::nullopt;

  auto coordinator = std::make_shared<coordinator_parts>();
  coordinator->job_id = job_id;
  coordinator->host = layers::create_backend("cpu", 1, error);
  coordinator->run =
      std::make_unique<training_run>(config, data.train, data.test, *coordinator->host, observer);
  coordinator->first_stage = connect(net, transport::stage_address(net.prefix, 0), error);
  if (!coordinator->first_stage) return std::nullopt;
  coordinator->clock = &clock;
  coordinator->trace = options.trace;

  std::vector<std::shared_ptr<stage_parts>> parts;
  for (int s = 0; s < stages; ++s) {
    parts.push_back(make_stage(config, (*ranges)[s], s, coordinator->run->steps_per_epoch(),
                               coordinator->run->total_steps(), net, error));
    if (!parts.back()) return std::nullopt;
    parts.back()->job_id = job_id;
    parts.back()->clock = &clock;
    parts.back()->trace = options.trace;
    parts.back()->collect_weights = options.collect_weights;
  }

  caf::actor_system_config settings;
  settings.set("scheduler.max-threads",
               std::max(1, std::min<int>(stages, std::thread::hardware_concurrency())));
  caf::actor_system system{settings};
  caf::scoped_actor self{system};
  coordinator->listener = caf::actor{self};
  std::vector<caf::actor> targets;
  for (auto& stage : parts) targets.push_back(system.spawn(stage_actor, stage));
  caf::actor coordinator_handle = system.spawn(coordinator_actor, coordinator);
  targets.push_back(coordinator_handle);

  // Decoded messages go to the actor of their target stage; the coordinator's inbox is last.
  transport::receiver_thread receiver(
      net.context, std::move(net.inboxes),
      [&targets, stages](transport::message&& incoming) {
        const int target = incoming.header.target_stage;
        const int slot = target == transport::coordinator_stage ? stages : target;
        if (slot < 0 || slot > stages) return;
        caf::anon_send(targets[slot], std::move(incoming));
      },
      [](const std::string& address, const transport::decode_error& problem) {
        std::fprintf(stderr, "troupe: dropped a frame at %s: %s\n", address.c_str(),
                     problem.text.c_str());
      });
  caf::anon_send(coordinator_handle, start_atom::value);
  self->receive([](done_atom) {});

  pipeline_report report;
  report.summary = coordinator->run->summary();
  for (int s = 0; s < stages; ++s) {
    self->request(targets[s], caf::infinite, collect_atom::value)
        .receive([&](const stage_report& stage) { report.stages.push_back(stage); },
                 [&](const caf::error&) { report.stages.emplace_back(); });
  }
  receiver.stop();
  report.dropped_frames = receiver.dropped();
  for (auto& target : targets) caf::anon_send_exit(target, caf::exit_reason::user_shutdown);
  return report;
}

}  // namespace troupe::actors
