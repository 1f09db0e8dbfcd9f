#pragma once

// The pieces every real host of the engine is built from: the CAF actors that run stages and
// the coordinator, what each owns, and the ZeroMQ settings they send with. Internal to
// actors/: only the hosts include it (the in-process host and the cluster host).

#include <caf/all.hpp>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine/checkpoint_round.h"
#include "actors/engine/run_monitor.h"
#include "actors/engine/stage_logic.h"
#include "actors/engine/stage_settings.h"
#include "actors/engine/training_run.h"
#include "actors/hosts/pipeline_host.h"
#include "actors/storage/checkpoint_store.h"
#include "transport/endpoint.h"

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::transport::message)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::stage_report)

namespace troupe::actors {

using start_atom = caf::atom_constant<caf::atom("start")>;
using collect_atom = caf::atom_constant<caf::atom("collect")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
/// Tells an actor that one message waits for it in its own inbox (one process: see
/// stage_parts::inbox).
using take_atom = caf::atom_constant<caf::atom("take")>;
/// Asks the coordinator for a checkpoint at the next step boundary (bool: stop after it).
using checkpoint_atom = caf::atom_constant<caf::atom("ckpt")>;
/// A stage's reminder to itself: the next pass of its zero-bubble order can run.
using ready_work_atom = caf::atom_constant<caf::atom("ready")>;
/// Hands the coordinator a status report (JSON text) to pass to its observer.
using status_atom = caf::atom_constant<caf::atom("status")>;

/// Socket settings of every engine endpoint: queues far deeper than admission ever fills,
/// secured as `security` says (plain by default, which only loopback addresses accept).
transport::endpoint_options endpoint_settings(const transport::security_settings& security = {});

/// Sends on `out`; a full queue (which admission should make impossible) is waited out
/// rather than dropping a key. Returns false with the reason printed when the send failed.
/// When `reader` is set (one process), it is the actor that owns the inbox `out` sends to
/// and is told with a take_atom, after the send, to take the message itself.
bool send_on(transport::outbox& out, const transport::message& message,
             const caf::actor& reader = caf::actor{});

/// Counts a frame of `box` that did not decode in `dropped` and says why on stderr.
inline void report_dropped_frame(const transport::inbox& box,
                                 const transport::decode_result& received, uint64_t& dropped) {
  ++dropped;
  std::fprintf(stderr, "troupe: dropped a frame at %s: %s\n", box.address().c_str(),
               received.error.text.c_str());
}

/// Takes the message a take_atom announced from the actor's own inbox and hands it to
/// `handle`; frames ahead of it that do not decode are reported and counted in `dropped`. The
/// send that queued the message happened before the take_atom was sent, so ZeroMQ has it;
/// should it not (yet) show, the actor looks again after the messages already in its mailbox.
template <class Handler>
void take_and_handle(caf::event_based_actor* self, std::optional<transport::inbox>& box,
                     uint64_t& dropped, Handler handle) {
  if (!box) return;
  for (bool dropped_one = false;; dropped_one = true) {
    std::optional<transport::decode_result> received = box->try_receive();
    if (!received) {
      // A dropped frame may have been the one announced (a sender that bypassed send_on).
      if (!dropped_one) self->send(self, take_atom::value);
      return;
    }
    if (received->ok()) {
      handle(*received->value);
      return;
    }
    report_dropped_frame(*box, *received, dropped);
  }
}

/// Everything a stage actor owns, made before the actor is spawned and handed over to it.
struct stage_parts {
  /// The stage actor's number: replica · parallelism.stages + stage (stage_settings.h). Wire
  /// routes, addresses and traces use it; the stage logic knows its stage and replica.
  int index = 0;
  uint64_t job_id = 0;
  std::unique_ptr<layers::backend> backend;
  std::unique_ptr<stage_device> device;
  std::unique_ptr<stage_logic> logic;
  std::optional<transport::outbox> next;
  std::optional<transport::outbox> previous;
  std::optional<transport::outbox> coordinator;
  /// Replicas: the same stage of the next replica, where this stage's ring chunks go.
  std::optional<transport::outbox> replica_next;
  int replica_next_index = 0;
  /// In one process, the actors owning the inboxes of next, previous, coordinator and
  /// replica_next (each send is followed by a take_atom to its reader); null where a receiver
  /// thread delivers.
  caf::actor next_reader, previous_reader, coordinator_reader, replica_next_reader;
  /// In one process, the stage's own inbox, read by its actor on each take_atom (no receiver
  /// thread in between: a message crosses one thread boundary, not two); empty in a cluster.
  std::optional<transport::inbox> inbox;
  /// The actors of the other stages its pipeline worker hosts in this process (interleaved),
  /// by stage (within the replica): the one whose pass is next is told when this stage moves
  /// the turn on.
  std::map<int, caf::actor> worker_siblings;
  uint64_t dropped_frames = 0;  ///< frames `inbox` refused; read after the actor ended
  clock_source* clock = nullptr;
  trace_recorder* trace = nullptr;
  /// Where the stage publishes what it does (null: nowhere), and what it last published
  /// (its buffers reused; send_outputs keeps its last_sent up to date).
  run_monitor* monitor = nullptr;
  stage_activity published;
  /// Tests only: called before the stage takes each message (it may block, to stall it).
  std::function<void(int actor, const message_note& message)> fault_hook;
  bool collect_weights = false;
  /// How long the stage's thread polls its mailbox after its work before it sleeps
  /// (mail_polling.h; 0: it sleeps at once), if the stage has a thread of its own.
  double spin_wait_s = 0;
};

/// Makes an allocation failure in one of `self`'s handlers end the process: one line on stderr
/// naming `who` and what ran out, then exit status 2 (the run cannot go on without the memory,
/// and an actor that ended would leave the others waiting for it). Other exceptions keep CAF's
/// handling.
void exit_when_out_of_memory(caf::scheduled_actor* self, std::string who);

/// Closes the stage's sockets (outboxes and its own inbox). Messages ZeroMQ still holds may own
/// tensors of its backend, so the parts (and backend) must outlive the transport context, which
/// ends after this.
void close_outboxes(stage_parts& parts);

struct stage_actor_state {
  std::shared_ptr<stage_parts> parts;
  /// A ready_work_atom is in the mailbox.
  bool ready_work_requested = false;
  /// Messages the stage may not take yet, in order: forwards (stage_logic::ready_for_forward),
  /// and while its gradients are summed with its replicas, evaluations and state requests.
  std::deque<transport::message> waiting;
  /// collect_atom answers that wait for the sum of the last step's gradients.
  std::vector<caf::response_promise> waiting_reports;
  /// In one process: messages read from the inbox ahead of their take_atom (take_for_stage()).
  std::deque<transport::message> taken;
  /// Frames dropped while reading ahead whose take_atom has not come yet.
  int64_t dropped_unclaimed = 0;
};

/// A stage: handles key messages (transport frames) and answers collect_atom with its report.
caf::behavior stage_actor(caf::stateful_actor<stage_actor_state>* self,
                          std::shared_ptr<stage_parts> parts);

/// Everything the coordinator actor owns.
struct coordinator_parts {
  uint64_t job_id = 0;
  /// The job (it outlives the run, as training_run requires).
  const job_config* config = nullptr;
  std::unique_ptr<layers::backend> host;
  std::unique_ptr<training_run> run;
  /// One outbox per stage actor: keys enter at stage 0 of their replica; checkpoints talk to
  /// every stage actor.
  std::vector<std::optional<transport::outbox>> stages;
  /// In one process, the stages' actors, told to take each message sent to them; else empty.
  std::vector<caf::actor> stage_readers;
  /// In one process, the coordinator's own inbox, read on each take_atom; else empty.
  std::optional<transport::inbox> inbox;
  uint64_t dropped_frames = 0;  ///< frames `inbox` refused; read after the actor ended
  clock_source* clock = nullptr;
  trace_recorder* trace = nullptr;
  run_monitor* monitor = nullptr;         ///< told when a stage reports (may be null)
  training_observer* observer = nullptr;  ///< checkpoint events (may be null)
  caf::actor listener;
  /// Where checkpoints go (null: the run takes none).
  std::unique_ptr<checkpoint_store> store;
  std::string job_name;
  std::string config_hash;
  /// Shards each stage loads before the first key (resume, init_from); empty: none.
  std::vector<std::shared_ptr<const std::string>> initial_shards;
  bool initial_weights_only = false;
  /// Set when the run cannot go on (a stage refused its shard); done_atom follows.
  std::string failure;

  /// The rounds with every stage: loading the shards before the start, saving checkpoints.
  checkpoint_round round{1};
};

struct coordinator_actor_state {
  std::shared_ptr<coordinator_parts> parts;
};

/// The coordinator: start_atom starts the run, stage reports drive it; sends done_atom to
/// parts->listener when the run has finished.
caf::behavior coordinator_actor(caf::stateful_actor<coordinator_actor_state>* self,
                                std::shared_ptr<coordinator_parts> parts);

/// The coordinator of `config`'s run as `options` say (checkpoints, resume, initial weights),
/// without its outboxes. Nothing, with `error` set, when the resume point does not fit.
std::shared_ptr<coordinator_parts> make_coordinator_parts(const job_config& config,
                                                          const job_data& data,
                                                          const pipeline_options& options,
                                                          training_observer& observer,
                                                          clock_source& clock, std::string* error);

/// Waits for the coordinator's done_atom, passing checkpoint requests on as they come and
/// watching for stalls (watch_run).
void await_run(caf::scoped_actor& self, const caf::actor& coordinator,
               const pipeline_options& options, double stall_timeout_s, clock_source& clock);

/// The stall watch, called between a coordinator's waits: when `monitor` saw keys in flight
/// and no report for `stall_timeout_s`, or a status report was asked for (SIGUSR2), prints the
/// report and hands it to the coordinator for its observer.
void watch_run(caf::scoped_actor& self, const caf::actor& coordinator,
               const pipeline_options& options, double stall_timeout_s, clock_source& clock);

/// Passes a pending checkpoint request (SIGUSR1: 1, SIGTERM: 2) to the coordinator.
void forward_checkpoint_request(caf::scoped_actor& self, const caf::actor& coordinator,
                                std::atomic<int>* requests);

/// Settings for troupe's actor systems: `threads` scheduler threads sharing one queue, each
/// blocked on its condition variable until a message arrives. A stage's handler computes for
/// milliseconds, so CAF's default work stealing fits it badly: its idle threads poll (100
/// tries, then every 50 µs for 500 more), preempting the stages' GEMM threads, and without the
/// polling a message from a non-actor thread (ZeroMQ's receiver) lands in a random busy
/// thread's queue and waits until that handler ends or an idle thread wakes to steal it (every
/// 10 ms): an async pipeline then ran its stages one after another.
void configure_scheduler(caf::actor_system_config& settings, int threads);

/// Where each stage and the coordinator receive, and (with CURVE) the public key each
/// receiving end proves to hold.
struct address_book {
  std::vector<std::string> stages;
  std::string coordinator;
  std::vector<std::string> stage_keys;  ///< parallel to `stages`; empty without CURVE
  std::string coordinator_key;
  transport::security_settings security;  ///< this process's own keys and policy
};

/// Builds stage actor `index` of `config` (replica index / stages, stage index % stages, whose
/// blocks are `range`) with outboxes to its neighbours, its replica peer and the coordinator
/// per `addresses` (one per stage actor). Returns null with `error` set when its device cannot
/// be opened or an address is malformed. `turns` are the job's make_pass_turns(), made once for
/// all the stages of one replica in the process.
std::shared_ptr<stage_parts> make_stage_parts(const job_config& config, const stage_range& range,
                                              int index, int64_t steps_per_epoch,
                                              int64_t total_steps,
                                              const std::vector<std::shared_ptr<pass_turn>>& turns,
                                              transport::transport_context& context,
                                              const address_book& addresses, std::string* error);

/// Tells each of `parts` (with its `actors`, in the same order) the actors of the other stages
/// of its pipeline worker (stage_parts::worker_siblings). Before the first message.
void connect_worker_siblings(const job_config& config,
                             const std::vector<std::shared_ptr<stage_parts>>& parts,
                             const std::vector<caf::actor>& actors);

/// Whether a process's `stage_actors` stage actors each run on a thread of their own (CAF
/// detached actors): when they are no more than its cores. Otherwise they take turns on the
/// scheduler's threads, and a stage that hops between threads takes its weights, gradients and
/// optimizer state from core to core: on a 2-core machine a 784×512 layer's optimizer step took
/// 3-4× as long as on the core whose caches held them.
bool stages_get_own_threads(size_t stage_actors);

/// How long a stage with a thread of its own polls for its next message before it sleeps
/// (parallelism.spin_wait_ms; -1 picks by mode).
double spin_wait_seconds(const parallelism_config& parallelism);

/// Spawns the stage actor of `parts`, on a thread of its own with `own_thread`.
caf::actor spawn_stage_actor(caf::actor_system& system, std::shared_ptr<stage_parts> parts,
                             bool own_thread);

/// Drops the handles of each other's actors that `parts` hold, once their actors have been told
/// to exit: a detached actor's thread ends only when its actor is gone.
void release_actor_handles(const std::vector<std::shared_ptr<stage_parts>>& parts);

/// An outbox to `address` with the engine's settings; with CURVE the inbox there must prove
/// it holds `server_key`. Nothing with `error` set on failure.
std::optional<transport::outbox> connect_outbox(transport::transport_context& context,
                                                const std::string& address, std::string* error,
                                                const transport::security_settings& security = {},
                                                const std::string& server_key = "");

}  // namespace troupe::actors
