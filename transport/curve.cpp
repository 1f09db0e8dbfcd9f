#include "transport/curve.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include <zmq.hpp>

#include "transport/endpoint.h"

namespace troupe::transport {
namespace {

namespace fs = std::filesystem;

constexpr size_t z85_key_length = 40;
constexpr size_t binary_key_length = 32;
constexpr size_t max_key_file_bytes = 4096;
constexpr size_t max_zap_frames = 16;
constexpr const char* zap_address = "inproc://zeromq.zap.01";
constexpr const char* zap_domain = "troupe";
constexpr const char* z85_alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
// ZMQ_ZAP_ENFORCE_DOMAIN, a draft option of libzmq 4.3 that the stable header hides: with it a
// CURVE server refuses clients when no ZAP handler answers instead of admitting them all.
constexpr int zap_enforce_domain_option = 93;

void set_error(std::string* error, std::string text) {
  if (error != nullptr) *error = std::move(text);
}

// Why `text` is not a Z85 CURVE key, or "" when it is one (then `*binary`, when not null, gets
// its 32 bytes).
std::string key_problem(const std::string& text, std::string* binary = nullptr) {
  if (text.size() != z85_key_length) {
    return "has " + std::to_string(text.size()) + " characters; a CURVE key is 40 Z85 characters";
  }
  for (size_t i = 0; i < text.size(); ++i) {
    if (std::strchr(z85_alphabet, text[i]) == nullptr || text[i] == '\0') {
      char shown[8];
      std::snprintf(shown, sizeof shown, "0x%02x", static_cast<unsigned char>(text[i]));
      return "character " + std::string(shown) + " at offset " + std::to_string(i) + " is not Z85";
    }
  }
  uint8_t bytes[binary_key_length];
  if (zmq_z85_decode(bytes, text.c_str()) == nullptr) return "is not a valid Z85 value";
  if (binary != nullptr) binary->assign(reinterpret_cast<const char*>(bytes), sizeof bytes);
  return "";
}

// The public key of a valid secret key, or "" when libzmq cannot derive it.
std::string public_key_of(const std::string& secret_key) {
  char derived[z85_key_length + 1];
  if (zmq_curve_public(derived, secret_key.c_str()) != 0) return "";
  return derived;
}

std::string trimmed(std::string text) {
  text.erase(text.find_last_not_of(" \t\r\n") + 1);
  return text.erase(0, text.find_first_not_of(" \t\r\n"));
}

// Reads the one key in `path`; a secret file must be private to its owner.
std::optional<std::string> read_key_file(const fs::path& path, bool secret, std::string* error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    set_error(error, path.string() + ": " + (errno == ENOENT ? "missing" : std::strerror(errno)));
    return std::nullopt;
  }
  struct stat info {};
  std::string problem;
  std::string content;
  if (::fstat(fd, &info) != 0) {
    problem = std::strerror(errno);
  } else if (!S_ISREG(info.st_mode)) {
    problem = "not a regular file";
  } else if (secret && (info.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(info.st_mode & 07777));
    problem = std::string("secret key is accessible by group or others (mode ") + mode +
              "); run chmod 600 on it";
  } else if (static_cast<uint64_t>(info.st_size) > max_key_file_bytes) {
    problem = "too large for a key file (" + std::to_string(info.st_size) + " bytes)";
  } else {
    char buffer[max_key_file_bytes];
    const ssize_t count = ::read(fd, buffer, sizeof buffer);
    if (count < 0) problem = std::strerror(errno);
    if (count > 0) content.assign(buffer, static_cast<size_t>(count));
  }
  ::close(fd);
  if (problem.empty()) {
    content = trimmed(content);
    problem = key_problem(content);
  }
  if (!problem.empty()) {
    set_error(error, path.string() + ": " + problem);
    return std::nullopt;
  }
  return content;
}

bool valid_key_name(const std::string& name) {
  if (name.empty() || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-' || c == '.';
  });
}

// Why `pair` is not a usable key pair ("" when it is); the public key may be empty when
// `need_public` is false.
std::string pair_problem(const curve_key_pair& pair, bool need_public) {
  const std::string secret = key_problem(pair.secret_key);
  if (!secret.empty()) return "secret key " + secret;
  if (pair.public_key.empty() && !need_public) return "";
  const std::string public_problem = key_problem(pair.public_key);
  if (!public_problem.empty()) return "public key " + public_problem;
  if (public_key_of(pair.secret_key) != pair.public_key) {
    return "public key does not belong to the secret key";
  }
  return "";
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

// The answer to one ZAP request: status code, status text and user id.
struct zap_verdict {
  const char* status = "500";
  std::string reason;
  std::string user_id;
};

// The frames of one ZAP request (RFC 27): version "1.0", request id, domain, peer address,
// routing id, mechanism, credentials (CURVE: the client's 32-byte public key). At most
// max_zap_frames are kept; empty when nothing is waiting or the context is terminating.
std::vector<zmq::message_t> receive_request(zmq::socket_t& handler) {
  std::vector<zmq::message_t> request;
  try {
    for (bool more = true; more;) {
      zmq::message_t part;
      if (!handler.recv(part, zmq::recv_flags::dontwait)) break;
      more = part.more();
      if (request.size() < max_zap_frames) request.push_back(std::move(part));
    }
  } catch (const zmq::error_t&) {
    request.clear();
  }
  return request;
}

// Admits a CURVE client of our domain whose key passes `is_allowed`. A REP socket must answer
// every request it reads, so a malformed one gets status 500 rather than silence.
template <class Predicate>
zap_verdict judge(const std::vector<zmq::message_t>& request, Predicate is_allowed) {
  if (request.size() < 6 || request[0].to_string() != "1.0") {
    return {"500", "malformed ZAP request", ""};
  }
  if (request[2].to_string() != zap_domain || request[5].to_string() != "CURVE") {
    return {"400", "only CURVE clients of domain 'troupe' are admitted", ""};
  }
  if (request.size() != 7 || request[6].size() != binary_key_length) {
    return {"400", "malformed CURVE credentials", ""};
  }
  char z85[z85_key_length + 1];
  zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), binary_key_length);
  if (!is_allowed(request[6].to_string())) {
    return {"400", "public key " + std::string(z85) + " is not on the allow-list", ""};
  }
  return {"200", "OK", z85};
}

void send_reply(zmq::socket_t& handler, const std::string& request_id, const zap_verdict& verdict) {
  const std::string frames[] = {"1.0",          request_id,      verdict.status,
                                verdict.reason, verdict.user_id, ""};
  try {
    for (size_t i = 0; i < 6; ++i) {
      handler.send(zmq::buffer(frames[i]),
                   i + 1 < 6 ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  } catch (const zmq::error_t&) {
    // terminating: nobody waits for the answer any more
  }
}

}  // namespace

bool curve_available() { return zmq_has("curve") != 0; }

std::optional<curve_key_pair> generate_key_pair(std::string* error) {
  char public_key[z85_key_length + 1];
  char secret_key[z85_key_length + 1];
  if (!curve_available() || zmq_curve_keypair(public_key, secret_key) != 0) {
    set_error(error, "this libzmq was built without CURVE (zmq_has(\"curve\") is false)");
    return std::nullopt;
  }
  return curve_key_pair{public_key, secret_key};
}

std::string key_pair_problem(const std::string& name, const curve_key_pair& pair) {
  if (!valid_key_name(name))
    return "key name '" + name + "' must be letters, digits, '_', '-' or '.'";
  const std::string problem = pair_problem(pair, true);
  return problem.empty() ? "" : name + ".key: refusing to write: " + problem;
}

std::optional<curve_key_pair> read_key_pair(const std::string& directory, const std::string& name,
                                            std::string* error) {
  const fs::path folder(directory);
  const fs::path public_path = folder / (name + ".pub");
  std::optional<std::string> secret = read_key_file(folder / (name + ".key"), true, error);
  if (!secret) return std::nullopt;
  std::optional<std::string> public_key = read_key_file(public_path, false, error);
  if (!public_key) return std::nullopt;
  if (public_key_of(*secret) != *public_key) {
    set_error(error, public_path.string() + ": does not match " + name + ".key");
    return std::nullopt;
  }
  return curve_key_pair{*public_key, *secret};
}

std::optional<std::vector<std::string>> read_public_keys(const std::string& directory,
                                                         std::string* error) {
  std::vector<fs::path> files;
  std::error_code code;
  for (fs::directory_iterator it(directory, code), end; !code && it != end; it.increment(code)) {
    if (it->path().extension() == ".pub") files.push_back(it->path());  // read_key_file checks
  }
  if (code) {
    set_error(error, directory + ": cannot read the key directory: " + code.message());
    return std::nullopt;
  }
  if (files.empty()) {
    set_error(error, directory + ": no *.pub files (the allow-list is empty)");
    return std::nullopt;
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> keys;
  for (const fs::path& file : files) {
    std::optional<std::string> key = read_key_file(file, false, error);
    if (!key) return std::nullopt;
    keys.push_back(std::move(*key));
  }
  return keys;
}

bool is_loopback_address(const std::string& address) {
  if (address.rfind("inproc://", 0) == 0 || address.rfind("ipc://", 0) == 0) return true;
  if (address.rfind("tcp://", 0) != 0) return false;
  const std::string rest = address.substr(6);
  if (rest.find(';') != std::string::npos) return false;  // "source;destination" form
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    return close != std::string::npos && is_loopback_host(rest.substr(1, close - 1));
  }
  return is_loopback_host(rest.substr(0, rest.rfind(':')));
}

std::optional<std::string> secure_socket(transport_context& context, zmq::socket_t& socket,
                                         const std::string& address,
                                         const security_settings& settings, endpoint_role role) {
  const bool server = role == endpoint_role::inbox;
  if (!settings.curve) {
    if (settings.allow_insecure || is_loopback_address(address)) return std::nullopt;
    return std::string(server ? "binding " : "connecting to ") + address +
           " without CURVE keys; pass keys or --insecure";
  }
  if (!curve_available()) {
    return "CURVE requested for " + address +
           " but this libzmq was built without it (zmq_has(\"curve\") is false)";
  }
  const std::string problem = pair_problem(settings.own, !server);
  if (!problem.empty()) return "CURVE keys for " + address + ": own " + problem;
  if (server) {
    if (settings.allowed_public_keys.empty()) {
      return "CURVE inbox " + address + " has no allowed public keys";
    }
    std::string refusal;
    if (!zap_authenticator::admit(context, settings.allowed_public_keys, &refusal)) {
      return "CURVE inbox " + address + ": " + refusal;
    }
    socket.set(zmq::sockopt::curve_server, true);
    socket.set(zmq::sockopt::curve_secretkey, settings.own.secret_key);
    socket.set(zmq::sockopt::zap_domain, zap_domain);
    const int enforce = 1;  // unsupported without draft options; the bind-time check remains
    zmq_setsockopt(socket.handle(), zap_enforce_domain_option, &enforce, sizeof enforce);
    return std::nullopt;
  }
  const std::string server_problem = key_problem(settings.server_public_key);
  if (!server_problem.empty()) return "CURVE server key for " + address + " " + server_problem;
  socket.set(zmq::sockopt::curve_serverkey, settings.server_public_key);
  socket.set(zmq::sockopt::curve_publickey, settings.own.public_key);
  socket.set(zmq::sockopt::curve_secretkey, settings.own.secret_key);
  return std::nullopt;
}

// ---- zap_authenticator ----

zap_authenticator::zap_authenticator(transport_context& context) : context_(context) {}

zap_authenticator::~zap_authenticator() { stop(); }

std::unique_ptr<zap_authenticator> zap_authenticator::start(transport_context& context,
                                                            std::string* error) {
  std::unique_ptr<zap_authenticator> authenticator(new zap_authenticator(context));
  return authenticator->open(error) ? std::move(authenticator) : nullptr;
}

bool zap_authenticator::open(std::string* error) {
  if (!curve_available()) {
    set_error(error, "this libzmq was built without CURVE (zmq_has(\"curve\") is false)");
    return false;
  }
  static std::atomic<uint64_t> next_wake_id{0};
  const std::string wake_address =
      "inproc://troupe-zap-wake-" + std::to_string(next_wake_id.fetch_add(1));
  std::lock_guard<std::mutex> stop_lock(stop_mutex_);
  std::lock_guard<std::mutex> lock(context_.authenticator_mutex_);
  if (context_.authenticator_ != nullptr) {
    set_error(error, "a zap_authenticator already runs on this transport_context");
    return false;
  }
  try {
    handler_ = std::make_unique<zmq::socket_t>(*context_.context_, zmq::socket_type::rep);
    handler_->set(zmq::sockopt::linger, 0);
    handler_->bind(zap_address);
    wake_receiver_ = std::make_unique<zmq::socket_t>(*context_.context_, zmq::socket_type::pair);
    wake_receiver_->set(zmq::sockopt::linger, 0);
    wake_receiver_->bind(wake_address);
    wake_sender_ = std::make_unique<zmq::socket_t>(*context_.context_, zmq::socket_type::pair);
    wake_sender_->set(zmq::sockopt::linger, 0);
    wake_sender_->connect(wake_address);
  } catch (const zmq::error_t& failure) {
    set_error(error, std::string("cannot bind ") + zap_address + ": " + failure.what());
    return false;
  }
  context_.authenticator_ = this;
  registered_ = true;
  thread_ = std::thread([this] { run(); });
  return true;
}

void zap_authenticator::stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mutex_);
  if (registered_) {
    std::lock_guard<std::mutex> lock(context_.authenticator_mutex_);
    context_.authenticator_ = nullptr;
    registered_ = false;
  }
  if (thread_.joinable()) {
    try {
      wake_sender_->send(zmq::message_t(), zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
      // Only a terminating context refuses; its poll has then already ended the thread.
    }
    thread_.join();
  }
  if (handler_) {
    try {
      // Unbinding an inproc address is synchronous, unlike closing: once stop() returns, new
      // handshakes find no handler (and are refused where ZAP is enforced).
      handler_->unbind(zap_address);
    } catch (const zmq::error_t&) {
      // a terminating context has released the address already
    }
  }
  handler_.reset();
  wake_receiver_.reset();
  wake_sender_.reset();
}

bool zap_authenticator::admit(transport_context& context,
                              const std::vector<std::string>& public_keys, std::string* error) {
  std::lock_guard<std::mutex> lock(context.authenticator_mutex_);
  if (context.authenticator_ == nullptr) {
    set_error(error, "no zap_authenticator runs on its transport_context; start one first");
    return false;
  }
  return context.authenticator_->allow(public_keys, error);
}

bool zap_authenticator::allow(const std::vector<std::string>& public_keys, std::string* error) {
  std::vector<std::string> binary(public_keys.size());
  for (size_t i = 0; i < public_keys.size(); ++i) {
    const std::string problem = key_problem(public_keys[i], &binary[i]);
    if (!problem.empty()) {
      set_error(error, "allowed public key " + std::to_string(i) + " " + problem);
      return false;
    }
  }
  std::lock_guard<std::mutex> lock(keys_mutex_);
  allowed_keys_.insert(binary.begin(), binary.end());
  return true;
}

std::string zap_authenticator::last_denial() const {
  std::lock_guard<std::mutex> lock(keys_mutex_);
  return last_denial_;
}

void zap_authenticator::run() {
  zmq_pollitem_t items[] = {{wake_receiver_->handle(), 0, ZMQ_POLLIN, 0},
                            {handler_->handle(), 0, ZMQ_POLLIN, 0}};
  while (true) {
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& failure) {
      if (failure.num() == EINTR) continue;
      return;  // the context is terminating
    }
    if ((items[0].revents & ZMQ_POLLIN) != 0) return;
    if ((items[1].revents & ZMQ_POLLIN) != 0) answer_one();
  }
}

void zap_authenticator::answer_one() {
  const std::vector<zmq::message_t> request = receive_request(*handler_);
  if (request.empty()) return;
  zap_verdict verdict;
  {
    std::lock_guard<std::mutex> lock(keys_mutex_);
    verdict =
        judge(request, [this](const std::string& key) { return allowed_keys_.count(key) != 0; });
    if (verdict.status == std::string("200")) {
      admitted_.fetch_add(1);
    } else {
      denied_.fetch_add(1);
      last_denial_ = "ZAP denied peer " + (request.size() > 3 ? request[3].to_string() : "?") +
                     ": " + verdict.reason;
    }
  }
  send_reply(*handler_, request.size() > 1 ? request[1].to_string() : "", verdict);
}

}  // namespace troupe::transport
