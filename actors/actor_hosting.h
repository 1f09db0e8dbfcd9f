#pragma once

// The pieces every real host of the engine is built from: the CAF actors that run stages and
// the coordinator, what each owns, and the ZeroMQ settings they send with. Internal to
// actors/: only the hosts include it (the in-process host and the cluster host).

#include <caf/all.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/pipeline_host.h"
#include "actors/stage_logic.h"
#include "actors/training_run.h"
#include "transport/endpoint.h"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::transport::message)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::stage_report)

namespace troupe::actors {

using start_atom = caf::atom_constant<caf::atom("start")>;
using collect_atom = caf::atom_constant<caf::atom("collect")>;
using done_atom = caf::atom_constant<caf::atom("done")>;

/// Socket settings of every engine endpoint: queues far deeper than admission ever fills,
/// secured as `security` says (plain by default, which only loopback addresses accept).
transport::endpoint_options endpoint_settings(const transport::security_settings& security = {});

/// Sends on `out`; a full queue (which admission should make impossible) is waited out
/// rather than dropping a key. Returns false with the reason printed when the send failed.
bool send_on(transport::outbox& out, const transport::message& message);

/// Everything a stage actor owns, made before the actor is spawned and handed over to it.
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

struct stage_actor_state {
  std::shared_ptr<stage_parts> parts;
};

/// A stage: handles key messages (transport frames) and answers collect_atom with its report.
caf::behavior stage_actor(caf::stateful_actor<stage_actor_state>* self,
                          std::shared_ptr<stage_parts> parts);

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

struct coordinator_actor_state {
  std::shared_ptr<coordinator_parts> parts;
};

/// The coordinator: start_atom starts the run, stage reports drive it; sends done_atom to
/// parts->listener when the run has finished.
caf::behavior coordinator_actor(caf::stateful_actor<coordinator_actor_state>* self,
                                std::shared_ptr<coordinator_parts> parts);

/// The CPU threads each stage's backend may use: the job's share of the cores, split evenly.
int threads_per_stage(const job_config& config);

/// The device of stage `stage` per parallelism.devices (one for all, or one per stage).
const std::string& device_of_stage(const job_config& config, int stage);

/// Where each stage and the coordinator receive, and (with CURVE) the public key each
/// receiving end proves to hold.
struct address_book {
  std::vector<std::string> stages;
  std::string coordinator;
  std::vector<std::string> stage_keys;  ///< parallel to `stages`; empty without CURVE
  std::string coordinator_key;
  transport::security_settings security;  ///< this process's own keys and policy
};

/// Builds stage `index` of `config` (blocks `range`) with outboxes to its neighbours and the
/// coordinator per `addresses`. Returns null with `error` set when its device cannot be opened
/// or an address is malformed.
std::shared_ptr<stage_parts> make_stage_parts(const job_config& config, const stage_range& range,
                                              int index, int64_t steps_per_epoch,
                                              int64_t total_steps,
                                              transport::transport_context& context,
                                              const address_book& addresses, std::string* error);

/// An outbox to `address` with the engine's settings; with CURVE the inbox there must prove
/// it holds `server_key`. Nothing with `error` set on failure.
std::optional<transport::outbox> connect_outbox(transport::transport_context& context,
                                                const std::string& address, std::string* error,
                                                const transport::security_settings& security = {},
                                                const std::string& server_key = "");

}  // namespace troupe::actors
