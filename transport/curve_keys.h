#pragma once

// CURVE keys and an endpoint's security settings: what a program starting coordinators and
// workers (actors/cluster/cluster_host.h) sets, without ZeroMQ's types (curve.h applies them to
// sockets). Keys are Z85 text, 40 characters each (32 bytes). Errors are values naming the file;
// nothing here throws or aborts on bad files.

#include <optional>
#include <string>
#include <vector>

namespace troupe::transport {

/// A CURVE key pair as Z85 text (40 characters each).
struct curve_key_pair {
  std::string public_key;
  std::string secret_key;
};

/// Who an endpoint trusts and how it proves itself; part of endpoint_options.
struct security_settings {
  /// Encrypt and authenticate with CURVE; then `own` must hold a valid pair. Applies to tcp://
  /// and ipc://; inproc:// peers share the process and skip the handshake.
  bool curve = false;
  /// This node's key pair (an inbox needs only the secret key).
  curve_key_pair own;
  /// Outbox only: the public key the inbox it connects to must prove to hold.
  std::string server_public_key;
  /// Inbox only: client public keys admitted (the cluster's *.pub files); must not be empty.
  std::vector<std::string> allowed_public_keys;
  /// Lets a plaintext endpoint bind or connect a non-loopback address (the --insecure flag).
  bool allow_insecure = false;
};

/// True when this libzmq was built with CURVE (zmq_has("curve")).
bool curve_available();

/// A fresh key pair from zmq_curve_keypair; nothing, with `*error` set (when not null), if this
/// libzmq lacks CURVE.
std::optional<curve_key_pair> generate_key_pair(std::string* error);

/// Why NAME.key and NAME.pub cannot hold `pair` ("" when they can): `name` is not letters,
/// digits, '_', '-' and '.' or starts with '.', or a key is malformed, or the public key does
/// not belong to the secret key. (actors/cluster/key_files.h writes them.)
std::string key_pair_problem(const std::string& name, const curve_key_pair& pair);

/// Reads NAME.key and NAME.pub from `directory`. Refuses a secret file that group or others may
/// access, a key that is not 40 Z85 characters, and a public key that does not belong to the
/// secret key; `*error` (when not null) names the file.
std::optional<curve_key_pair> read_key_pair(const std::string& directory, const std::string& name,
                                            std::string* error);

/// The public keys of every *.pub file in `directory`, in file-name order: the allow-list of a
/// cluster. Refuses a directory without any and any malformed file, naming it.
std::optional<std::vector<std::string>> read_public_keys(const std::string& directory,
                                                         std::string* error);

/// True for inproc://, ipc:// and tcp:// addresses whose host is a loopback address
/// (127.0.0.0/8, localhost, ::1); false for everything else, wildcards and interface names
/// included.
bool is_loopback_address(const std::string& address);

}  // namespace troupe::transport
