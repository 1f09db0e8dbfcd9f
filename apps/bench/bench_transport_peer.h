#pragma once

// One process's side of `troupe bench transport` (bench_transport.cpp): per security mode a raw
// ZeroMQ PULL/PUSH pair and a troupe inbox/outbox pair to the other process, the ZAP handlers
// that admit the peer's key on both, and the control messages the two processes trade.

#include <array>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <zmq.hpp>

#include "transport/endpoint.h"

namespace troupe::apps::transport_bench {

constexpr std::chrono::milliseconds receive_timeout{10000};
constexpr int modes_count = 2;  // CURVE off, CURVE on

/// Pins the process to the `slot`-th CPU it may run on (when it may run on two or more) and
/// keeps glibc from trimming its heap; the CPU, or -1 when not pinned.
int steady_process(int slot);

struct bench_keys {
  transport::curve_key_pair parent;
  transport::curve_key_pair child;
};

/// The sockets of one process for one security mode: what it receives on, what it sends on.
struct link_sockets {
  std::unique_ptr<zmq::socket_t> raw_in;
  std::unique_ptr<zmq::socket_t> raw_out;
  std::optional<transport::inbox> troupe_in;
  std::optional<transport::outbox> troupe_out;
};

class raw_zap_handler;

/// One process's side. Members are destroyed in reverse order: sockets, then the ZAP handlers,
/// then the contexts, as ZeroMQ requires. One ZeroMQ I/O thread per context, raw and troupe.
class bench_peer {
 public:
  bench_peer(transport::curve_key_pair own, std::string peer_public_key, bool curve);
  ~bench_peer();
  bench_peer(const bench_peer&) = delete;
  bench_peer& operator=(const bench_peer&) = delete;

  int modes() const { return modes_; }
  link_sockets& at(bool curve) { return links_[curve ? 1 : 0]; }
  link_sockets& control() { return links_[0]; }

  /// Binds every inbox, trades ports with the peer over `channel`, connects every outbox.
  bool open(int channel, std::string* error);

  /// Handshakes this process's ZAP handlers admitted, raw and troupe.
  std::array<double, 2> admitted() const;
  /// Requests they denied, both together.
  double denied() const;

 private:
  using port_list = std::array<int32_t, 2 * modes_count>;  // raw, troupe per mode

  transport::endpoint_options troupe_options(bool curve) const;
  std::unique_ptr<zmq::socket_t> raw_socket(zmq::socket_type type);
  bool bind(link_sockets& into, bool curve, int32_t* ports, std::string* error);
  bool connect(link_sockets& into, bool curve, const int32_t* ports, std::string* error);
  static bool trade_ports(int channel, const port_list& local, port_list& remote,
                          std::string* error);

  transport::curve_key_pair own_;
  std::string peer_public_key_;
  int modes_;
  zmq::context_t raw_context_{1};
  transport::transport_context troupe_context_{1};
  std::unique_ptr<transport::zap_authenticator> troupe_zap_;
  std::unique_ptr<raw_zap_handler> raw_zap_;
  std::array<link_sockets, modes_count> links_;
};

/// Sends `outgoing` whole within receive_timeout; false, said on stderr, when it cannot.
bool send_whole(transport::outbox& out, const transport::message& outgoing);

/// A control message with `text` and `metrics` in its header.
transport::message control_message(const std::string& text,
                                   std::map<std::string, double> metrics = {});

/// A header-only control message whose encoded header is `bytes` long.
transport::message latency_probe(size_t bytes);

/// The next message of `in` within `timeout`; nothing when none came or it did not decode.
std::optional<transport::message> receive_message(transport::inbox& in,
                                                  std::chrono::milliseconds timeout);

}  // namespace troupe::apps::transport_bench
