#pragma once

// ZeroMQ endpoints that carry messages between stages. An inbox binds an address and receives;
// an outbox connects to one inbox and sends. Any number of outboxes may connect to one inbox
// (PUSH/PULL underneath), messages from one outbox arrive in the order they were sent, and every
// message arrives whole or not at all. The same code runs over inproc:// (one process, payloads
// are never copied), ipc:// (one machine) and tcp:// (a cluster); only the address changes.
//
// Threads: the transport_context is thread-safe. An outbox or inbox is used by one thread at a
// time (ZeroMQ sockets are not thread-safe); it may move to another thread only across a
// synchronization point such as a thread start or a mutex. A receiver_thread takes its inboxes
// over and is then the only thread that touches them.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/codec.h"
#include "transport/curve.h"
#include "transport/message.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace troupe::transport {

/// "inproc://troupe-<job_id>": the address prefix of an embedded (one-process) job.
std::string inproc_prefix(uint64_t job_id);

/// Address of stage `stage`'s inbox under `prefix`: "inproc://troupe-7" gives
/// "inproc://troupe-7/stage-3"; "ipc:///run/troupe-7" gives "ipc:///run/troupe-7/stage-3" (the
/// directory must exist); "tcp://10.0.0.5:5550" gives "tcp://10.0.0.5:5553" (base port plus
/// stage). Returns "" for a negative stage, an unknown scheme, a tcp prefix without a numeric
/// port, or a port past 65535.
std::string stage_address(const std::string& prefix, int stage);

/// Settings of one outbox or inbox.
struct endpoint_options {
  /// Messages an outbox queues before send() reports would_block (ZMQ_SNDHWM).
  int send_high_water_mark = 32;
  /// Messages an inbox queues before its senders are pushed back (ZMQ_RCVHWM). Over inproc
  /// the two marks add up: a pair holds at most their sum.
  int receive_high_water_mark = 32;
  /// Milliseconds a closing endpoint keeps trying to deliver queued messages (ZMQ_LINGER). The
  /// default 0 drops them, so shutdown never hangs on a dead peer; the protocol acknowledges
  /// what must not be lost.
  int linger_ms = 0;
  /// What an inbox accepts and an outbox agrees to send.
  decode_limits limits;
  /// CURVE keys and allow-list (see curve.h). The default, plaintext without allow_insecure,
  /// opens loopback addresses only; any other address needs CURVE or allow_insecure.
  security_settings security;
};

/// Why an endpoint could not be opened: one line naming the address.
struct endpoint_error {
  std::string text;
};

/// Owns the ZeroMQ context of one process. inproc:// addresses connect only endpoints made
/// from the same context. Thread-safe; must outlive every endpoint made from it (destroying it
/// first blocks until they are gone).
class transport_context {
 public:
  /// A context with `io_threads` ZeroMQ I/O threads (used by ipc:// and tcp:// only).
  explicit transport_context(int io_threads = 1);
  ~transport_context();
  transport_context(const transport_context&) = delete;
  transport_context& operator=(const transport_context&) = delete;

 private:
  friend class outbox;
  friend class inbox;
  friend class receiver_thread;
  friend class zap_authenticator;
  std::unique_ptr<zmq::context_t> context_;
  std::mutex authenticator_mutex_;
  zap_authenticator* authenticator_ = nullptr;  // the one running here; guarded by the mutex
};

/// What became of one send().
enum class send_status : uint8_t {
  sent,             ///< queued whole; ZeroMQ now holds the payload owners until delivered
  would_block,      ///< the high-water mark is reached; nothing was queued, retry later
  invalid_message,  ///< the message fails validate_message(); nothing was queued
  failed,           ///< the endpoint is closed or its context is terminating
};

/// "sent", "would_block", ... (the enumerator's name).
const char* to_string(send_status status);

/// The outcome of a send() and, unless it was sent, one line saying why.
struct send_result {
  send_status status = send_status::failed;
  std::string detail;

  /// True when the message was queued.
  bool ok() const { return status == send_status::sent; }
};

/// The sending end of one connection. Move-only; one thread at a time (see the file comment).
class outbox {
 public:
  /// Connects to `address` (inproc://, ipc:// or tcp://; the inbox may bind later). Returns
  /// nothing and sets `*error` (when not null) if the address is malformed.
  static std::optional<outbox> connect(transport_context& context, const std::string& address,
                                       const endpoint_options& options = endpoint_options{},
                                       endpoint_error* error = nullptr);
  outbox(outbox&& other) noexcept;
  outbox& operator=(outbox&& other) noexcept;
  ~outbox();

  /// Queues `outgoing` without blocking: the header is encoded, the payloads are handed to
  /// ZeroMQ without copying (each keeps its frame's owner until ZeroMQ is done with it; a frame
  /// without an owner is copied). Returns would_block instead of growing the queue.
  send_result send(const message& outgoing);

  /// Waits up to `timeout` until a send() would not report would_block; false on timeout.
  bool wait_writable(std::chrono::milliseconds timeout);

  /// send(), waiting out a full queue for up to `timeout` in all (negative: no limit) instead
  /// of reporting would_block; for callers that must not drop a message.
  send_result send_waiting(const message& outgoing, std::chrono::milliseconds timeout);

  /// The address this outbox connects to.
  const std::string& address() const { return address_; }

 private:
  outbox(std::unique_ptr<zmq::socket_t> socket, std::string address, endpoint_options options);
  send_result send_parts(const std::vector<uint8_t>& header, const std::vector<frame>& payloads);

  std::unique_ptr<zmq::socket_t> socket_;
  std::string address_;
  endpoint_options options_;
};

/// The receiving end: binds one address and yields decoded messages or the reasons frames were
/// dropped. Move-only; one thread at a time (see the file comment).
class inbox {
 public:
  /// Binds `address` ("tcp://127.0.0.1:*" picks a free port; see address()). Returns nothing
  /// and sets `*error` (when not null) if the address is malformed or already bound.
  static std::optional<inbox> bind(transport_context& context, const std::string& address,
                                   const endpoint_options& options = endpoint_options{},
                                   endpoint_error* error = nullptr);
  inbox(inbox&& other) noexcept;
  inbox& operator=(inbox&& other) noexcept;
  ~inbox();

  /// Waits up to `timeout` (forever when negative) for one message. Returns nothing on timeout
  /// or when the context is terminating, else the decoded message or why it was dropped.
  /// Received payloads are not copied (except to fix alignment); their frames keep ZeroMQ's
  /// buffers alive and may be released on any thread.
  std::optional<decode_result> receive(std::chrono::milliseconds timeout);

  /// receive() without waiting.
  std::optional<decode_result> try_receive();

  /// The bound address, with the port filled in when a wildcard was bound.
  const std::string& address() const { return address_; }

 private:
  friend class receiver_thread;
  inbox(std::unique_ptr<zmq::socket_t> socket, std::string address, endpoint_options options);

  std::unique_ptr<zmq::socket_t> socket_;
  std::string address_;
  endpoint_options options_;
};

/// Called on the receiver thread with each decoded message; must not throw.
using message_handler = std::function<void(message&&)>;

/// Called on the receiver thread with each dropped message: the inbox address and the reason.
using drop_handler = std::function<void(const std::string& inbox_address, const decode_error&)>;

/// A thread that waits on several inboxes and hands every message to a callback. Callbacks run
/// one at a time on that thread, in arrival order per sender. Bad frames are counted, reported
/// to the drop handler and skipped; they never stop the thread.
class receiver_thread {
 public:
  /// Takes `inboxes` over (they must come from `context`) and starts the thread.
  receiver_thread(transport_context& context, std::vector<inbox> inboxes,
                  message_handler on_message, drop_handler on_drop = nullptr);
  /// Stops the thread (see stop()).
  ~receiver_thread();
  receiver_thread(const receiver_thread&) = delete;
  receiver_thread& operator=(const receiver_thread&) = delete;

  /// Wakes the thread and joins it; messages still queued are not delivered. Any thread but
  /// the receiver thread itself may call it (it aborts when called from a callback); idempotent.
  void stop();

  /// Messages handed to on_message so far; any thread.
  uint64_t delivered() const { return delivered_.load(); }
  /// Messages dropped as undecodable so far; any thread.
  uint64_t dropped() const { return dropped_.load(); }

 private:
  void run();
  void drain(inbox& source);

  std::vector<inbox> inboxes_;
  message_handler on_message_;
  drop_handler on_drop_;
  std::unique_ptr<zmq::socket_t> wake_receiver_;  // only the receiver thread touches it
  std::unique_ptr<zmq::socket_t> wake_sender_;    // only stop() touches it, under stop_mutex_
  std::mutex stop_mutex_;
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> dropped_{0};
  std::thread thread_;
};

}  // namespace troupe::transport
