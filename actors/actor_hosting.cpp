#include "actors/actor_hosting.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "actors/local_pipeline.h"
#include "actors/wire_format.h"
#include "layers/backend_registry.h"

namespace troupe::actors {
namespace {

/// Far more than max_active_keys messages ever wait on one socket, so a send never finds a
/// full queue; admission, not the socket, bounds memory.
constexpr int high_water_mark = 1 << 14;

}  // namespace

transport::endpoint_options endpoint_settings(const transport::security_settings& security) {
  transport::endpoint_options options;
  options.security = security;
  options.send_high_water_mark = high_water_mark;
  options.receive_high_water_mark = high_water_mark;
  return options;
}

bool send_on(transport::outbox& out, const transport::message& message) {
  const transport::send_result result = out.send_waiting(message, std::chrono::milliseconds(-1));
  if (!result.ok()) {
    std::fprintf(stderr, "troupe: send to %s failed: %s\n", out.address().c_str(),
                 result.detail.c_str());
  }
  return result.ok();
}

static const char* span_name(key_kind kind, bool last, bool stepped) {
  if (kind == key_kind::evaluate) return "evaluate";
  if (kind == key_kind::forward)
    return last ? (stepped ? "forward+backward+step" : "forward+backward") : "forward";
  return stepped ? "backward+step" : "backward";
}

static void send_outputs(stage_parts& parts, std::vector<stage_output>& outputs) {
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

static void handle_at_stage(stage_parts& parts, const transport::message& incoming) {
  const double start = parts.clock->now_seconds();
  std::string error;
  auto message = key_from_wire(incoming, *parts.backend, &error);
  if (!message) {
    std::fprintf(stderr, "troupe: stage %d dropped a message from stage %d: %s\n", parts.index,
                 incoming.header.source_stage, error.c_str());
    return;
  }
  const int64_t version = parts.logic->version();
  std::string refusal;
  std::vector<stage_output> outputs = parts.logic->handle(*message, &refusal);
  if (!refusal.empty()) {
    std::fprintf(stderr, "troupe: stage %d refused a %s message from stage %d: %s\n", parts.index,
                 transport::to_string(incoming.header.kind), incoming.header.source_stage,
                 refusal.c_str());
    return;
  }
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

static stage_report snapshot(stage_parts& parts) {
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

caf::behavior stage_actor(caf::stateful_actor<stage_actor_state>* self,
                          std::shared_ptr<stage_parts> parts) {
  self->state.parts = std::move(parts);
  return {
      [self](const transport::message& incoming) { handle_at_stage(*self->state.parts, incoming); },
      [self](collect_atom) { return snapshot(*self->state.parts); },
  };
}

static void dispatch(coordinator_parts& parts, const std::vector<key_message>& messages) {
  for (const key_message& message : messages) {
    wire_route route{parts.job_id, transport::coordinator_stage, 0, 0, parts.clock->now_seconds()};
    send_on(*parts.first_stage, to_wire(message, route));
  }
}

caf::behavior coordinator_actor(caf::stateful_actor<coordinator_actor_state>* self,
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

int threads_per_stage(const job_config& config) {
  int total = config.parallelism.threads;
  if (total <= 0) total = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, total / config.parallelism.stages);
}

const std::string& device_of_stage(const job_config& config, int stage) {
  const auto& devices = config.parallelism.devices;
  return devices.size() == 1 ? devices.front() : devices[stage];
}

std::optional<transport::outbox> connect_outbox(transport::transport_context& context,
                                                const std::string& address, std::string* error,
                                                const transport::security_settings& security,
                                                const std::string& server_key) {
  transport::security_settings settings = security;
  settings.server_public_key = server_key;
  transport::endpoint_error problem;
  auto out = transport::outbox::connect(context, address, endpoint_settings(settings), &problem);
  if (!out) *error = problem.text;
  return out;
}

static std::string key_of(const address_book& addresses, int stage) {
  return stage < static_cast<int>(addresses.stage_keys.size()) ? addresses.stage_keys[stage] : "";
}

std::shared_ptr<stage_parts> make_stage_parts(const job_config& config, const stage_range& range,
                                              int index, int64_t steps_per_epoch,
                                              int64_t total_steps,
                                              transport::transport_context& context,
                                              const address_book& addresses, std::string* error) {
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
    parts->next = connect_outbox(context, addresses.stages[index + 1], error, addresses.security,
                                 key_of(addresses, index + 1));
    if (!parts->next) return nullptr;
  }
  if (index > 0) {
    parts->previous = connect_outbox(context, addresses.stages[index - 1], error,
                                     addresses.security, key_of(addresses, index - 1));
    if (!parts->previous) return nullptr;
  }
  parts->coordinator = connect_outbox(context, addresses.coordinator, error, addresses.security,
                                      addresses.coordinator_key);
  if (!parts->coordinator) return nullptr;
  return parts;
}

}  // namespace troupe::actors
