#pragma once

// CURVE security for endpoints that leave the machine. Every node of a cluster owns a key pair
// (`troupe keygen DIR` writes NAME.key and NAME.pub); every inbox encrypts with CURVE and admits
// only clients whose public key is on the cluster's allow-list (the *.pub files of a key
// directory), checked by the zap_authenticator that runs on the inbox's transport_context.
// Loopback addresses (inproc://, ipc://, tcp://127.x.x.x, tcp://localhost, tcp://[::1]) may stay
// plaintext; binding or connecting any other address without CURVE is refused unless
// security_settings::allow_insecure says otherwise.
//
// Keys and settings are in curve_keys.h (the part a program using the library sees). Errors are
// values naming the file or the address; nothing here throws or aborts on bad files, settings
// or ZAP requests.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "transport/curve_keys.h"

namespace zmq {
class socket_t;
}  // namespace zmq

namespace troupe::transport {

class transport_context;

/// The side of a connection an endpoint is.
enum class endpoint_role : uint8_t {
  inbox,   ///< binds; the CURVE server
  outbox,  ///< connects; the CURVE client
};

/// For inbox::bind and outbox::connect, before they bind or connect `socket`: checks `settings`
/// against `address` (the non-loopback rule, CURVE support, key syntax), registers an inbox's
/// allow-list with the context's zap_authenticator and sets the CURVE socket options. Returns
/// why the endpoint must not open, or nothing. May throw zmq::error_t from setting options.
std::optional<std::string> secure_socket(transport_context& context, zmq::socket_t& socket,
                                         const std::string& address,
                                         const security_settings& settings, endpoint_role role);

/// Answers ZeroMQ's authentication (ZAP, RFC 27) requests of one transport_context on its own
/// thread: a CURVE client is admitted (status 200) only if its public key is on the allow-list,
/// every other request is denied (400) and counted. There is at most one per context (it binds
/// the context's "inproc://zeromq.zap.01"); a CURVE inbox can only be bound while one runs, and
/// each such bind adds the inbox's allowed_public_keys to its list, so all CURVE inboxes of a
/// context share one allow-list. It must be destroyed before its context and should outlive the
/// CURVE inboxes: without a handler, those refuse every client where libzmq supports
/// ZMQ_ZAP_ENFORCE_DOMAIN (Debian's does), and admit any client holding the server key
/// elsewhere. Thread-safe.
class zap_authenticator {
 public:
  /// Binds the ZAP address of `context` and starts the thread. Returns nothing and sets
  /// `*error` (when not null) if this libzmq lacks CURVE or another authenticator runs there.
  static std::unique_ptr<zap_authenticator> start(transport_context& context, std::string* error);
  /// Stops the thread (see stop()).
  ~zap_authenticator();
  zap_authenticator(const zap_authenticator&) = delete;
  zap_authenticator& operator=(const zap_authenticator&) = delete;

  /// Adds `public_keys` (Z85) to the allow-list; false with `*error` naming the first malformed
  /// key, in which case none is added.
  bool allow(const std::vector<std::string>& public_keys, std::string* error);

  /// Wakes the thread, joins it and releases the ZAP address; idempotent; any thread.
  void stop();

  /// Requests answered with 200 so far.
  uint64_t admitted() const { return admitted_.load(); }
  /// Requests answered with 400 or 500 so far.
  uint64_t denied() const { return denied_.load(); }
  /// One line on the latest denial (peer address, key, reason); "" before the first.
  std::string last_denial() const;

 private:
  friend std::optional<std::string> secure_socket(transport_context&, zmq::socket_t&,
                                                  const std::string&, const security_settings&,
                                                  endpoint_role);
  // Adds `public_keys` to the allow-list of the authenticator running on `context`.
  static bool admit(transport_context& context, const std::vector<std::string>& public_keys,
                    std::string* error);
  explicit zap_authenticator(transport_context& context);
  bool open(std::string* error);
  void run();
  void answer_one();

  transport_context& context_;
  std::unique_ptr<zmq::socket_t> handler_;        // only the thread touches it once started
  std::unique_ptr<zmq::socket_t> wake_receiver_;  // only the thread touches it
  std::unique_ptr<zmq::socket_t> wake_sender_;    // only stop() touches it, under stop_mutex_
  mutable std::mutex keys_mutex_;
  std::set<std::string> allowed_keys_;  // 32-byte binary keys, guarded by keys_mutex_
  std::string last_denial_;             // guarded by keys_mutex_
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> denied_{0};
  std::mutex stop_mutex_;
  bool registered_ = false;  // in context's authenticator_ slot; guarded by stop_mutex_
  std::thread thread_;
};

}  // namespace troupe::transport
