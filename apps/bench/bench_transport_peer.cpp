#include "apps/bench/bench_transport_peer.h"

#include <malloc.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <utility>
#include <vector>

#include <zmq_addon.hpp>

namespace troupe::apps::transport_bench {
namespace {

int port_of(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

}  // namespace

// Makes runs comparable: each process gets a CPU of its own when there are two or more (its
// threads, ZeroMQ's I/O thread included, then neither migrate nor land beside the other
// process's), and glibc keeps freed heap memory instead of returning it to the kernel after
// almost every received message. Without that, a 64 KiB message cost about 16 page faults, in
// bursts that favoured whichever context's I/O-thread arena sat at the top of its heap, and the
// troupe/raw ratio swung between 0.7 and 1.3 from run to run. Both apply to raw ZeroMQ and
// troupe alike; they affect the whole process, which `troupe bench` spends on one measurement.
// Returns the CPU, or -1 when the process was not pinned.
int steady_process(int slot) {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // 16 MiB messages stay on the heap as well
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return -1;
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != slot) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    return sched_setaffinity(0, sizeof one, &one) == 0 ? cpu : -1;
  }
  return -1;
}

// Answers the ZAP requests (RFC 27) of one raw ZeroMQ context exactly as
// transport::zap_authenticator answers troupe's: 200 with the client key (Z85) as user id for the
// allowed key, 400 for anything else. So raw and troupe connections are authenticated alike,
// once per handshake.
class raw_zap_handler {
 public:
  raw_zap_handler(zmq::context_t& context, const std::string& allowed_z85)
      : socket_(context, zmq::socket_type::rep), allowed_(32, '\0'), allowed_z85_(allowed_z85) {
    zmq_z85_decode(reinterpret_cast<uint8_t*>(allowed_.data()), allowed_z85.c_str());
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("inproc://zeromq.zap.01");
    thread_ = std::thread([this] { run(); });
  }
  ~raw_zap_handler() {
    stop_ = true;
    thread_.join();
  }
  raw_zap_handler(const raw_zap_handler&) = delete;
  raw_zap_handler& operator=(const raw_zap_handler&) = delete;

  uint64_t admitted() const { return admitted_.load(); }
  uint64_t denied() const { return denied_.load(); }

 private:
  void run() {
    try {
      while (!stop_) {
        zmq_pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) > 0) answer_one();
      }
    } catch (const zmq::error_t&) {  // the context is terminating
    }
  }

  // Request: version, request id, domain, address, routing id, mechanism, client key.
  void answer_one() {
    std::vector<zmq::message_t> request;
    if (!zmq::recv_multipart(socket_, std::back_inserter(request))) return;
    const bool admit = request.size() >= 7 && request[5].to_string() == "CURVE" &&
                       request[6].to_string() == allowed_;
    (admit ? admitted_ : denied_).fetch_add(1);
    const std::string request_id = request.size() > 1 ? request[1].to_string() : "";
    const std::string frames[] = {"1.0",
                                  request_id,
                                  admit ? "200" : "400",
                                  admit ? "OK" : "key not allowed",
                                  admit ? allowed_z85_ : "",
                                  ""};
    for (size_t i = 0; i < 6; ++i) {
      socket_.send(zmq::buffer(frames[i]),
                   i < 5 ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }

  zmq::socket_t socket_;  // only the thread touches it once started
  std::string allowed_;   // 32-byte binary key
  std::string allowed_z85_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> denied_{0};
  std::thread thread_;
};

bench_peer::bench_peer(transport::curve_key_pair own, std::string peer_public_key, bool curve)
    : own_(std::move(own)), peer_public_key_(std::move(peer_public_key)), modes_(curve ? 2 : 1) {}

bench_peer::~bench_peer() = default;

bool bench_peer::open(int channel, std::string* error) {
  if (modes_ > 1) {
    troupe_zap_ = transport::zap_authenticator::start(troupe_context_, error);
    if (!troupe_zap_) return false;
    raw_zap_ = std::make_unique<raw_zap_handler>(raw_context_, peer_public_key_);
  }
  port_list local{}, remote{};
  for (int mode = 0; mode < modes_; ++mode) {
    if (!bind(links_[mode], mode == 1, &local[2 * mode], error)) return false;
  }
  if (!trade_ports(channel, local, remote, error)) return false;
  for (int mode = 0; mode < modes_; ++mode) {
    if (!connect(links_[mode], mode == 1, &remote[2 * mode], error)) return false;
  }
  return true;
}

std::array<double, 2> bench_peer::admitted() const {
  if (!raw_zap_) return {0, 0};
  return {double(raw_zap_->admitted()), double(troupe_zap_->admitted())};
}

double bench_peer::denied() const {
  return raw_zap_ ? double(raw_zap_->denied() + troupe_zap_->denied()) : 0;
}

// The troupe endpoints' settings for one security mode.
transport::endpoint_options bench_peer::troupe_options(bool curve) const {
  transport::endpoint_options options;
  options.security.curve = curve;
  options.security.own = own_;
  options.security.server_public_key = peer_public_key_;
  options.security.allowed_public_keys = {peer_public_key_};
  return options;
}

// The same high-water marks and linger as a troupe endpoint, plus timeouts on every wait.
std::unique_ptr<zmq::socket_t> bench_peer::raw_socket(zmq::socket_type type) {
  const transport::endpoint_options defaults;
  auto socket = std::make_unique<zmq::socket_t>(raw_context_, type);
  socket->set(zmq::sockopt::linger, defaults.linger_ms);
  socket->set(zmq::sockopt::sndhwm, defaults.send_high_water_mark);
  socket->set(zmq::sockopt::rcvhwm, defaults.receive_high_water_mark);
  socket->set(zmq::sockopt::sndtimeo, static_cast<int>(receive_timeout.count()));
  socket->set(zmq::sockopt::rcvtimeo, static_cast<int>(receive_timeout.count()));
  return socket;
}

bool bench_peer::bind(link_sockets& into, bool curve, int32_t* ports, std::string* error) {
  into.raw_in = raw_socket(zmq::socket_type::pull);
  if (curve) {
    into.raw_in->set(zmq::sockopt::curve_server, true);
    into.raw_in->set(zmq::sockopt::curve_secretkey, own_.secret_key);
    into.raw_in->set(zmq::sockopt::zap_domain, "troupe-bench");
  }
  into.raw_in->bind("tcp://127.0.0.1:*");
  ports[0] = port_of(into.raw_in->get(zmq::sockopt::last_endpoint));
  transport::endpoint_error failure;
  into.troupe_in =
      transport::inbox::bind(troupe_context_, "tcp://127.0.0.1:*", troupe_options(curve), &failure);
  if (!into.troupe_in) *error = failure.text;
  if (!into.troupe_in) return false;
  ports[1] = port_of(into.troupe_in->address());
  return true;
}

bool bench_peer::connect(link_sockets& into, bool curve, const int32_t* ports, std::string* error) {
  into.raw_out = raw_socket(zmq::socket_type::push);
  if (curve) {
    into.raw_out->set(zmq::sockopt::curve_serverkey, peer_public_key_);
    into.raw_out->set(zmq::sockopt::curve_publickey, own_.public_key);
    into.raw_out->set(zmq::sockopt::curve_secretkey, own_.secret_key);
  }
  into.raw_out->connect("tcp://127.0.0.1:" + std::to_string(ports[0]));
  transport::endpoint_error failure;
  into.troupe_out =
      transport::outbox::connect(troupe_context_, "tcp://127.0.0.1:" + std::to_string(ports[1]),
                                 troupe_options(curve), &failure);
  if (!into.troupe_out) *error = failure.text;
  return into.troupe_out.has_value();
}

// Both sides write before they read, so neither can wait on the other.
bool bench_peer::trade_ports(int channel, const port_list& local, port_list& remote,
                             std::string* error) {
  if (send(channel, local.data(), sizeof local, MSG_NOSIGNAL) != sizeof local) {
    *error = "cannot send ports to the other process";
    return false;
  }
  pollfd ready{channel, POLLIN, 0};
  if (poll(&ready, 1, static_cast<int>(receive_timeout.count())) != 1 ||
      recv(channel, remote.data(), sizeof remote, MSG_WAITALL) != sizeof remote) {
    *error = "no ports from the other process";
    return false;
  }
  return true;
}

// ---- messages ----

bool send_whole(transport::outbox& out, const transport::message& outgoing) {
  const transport::send_result sent = out.send_waiting(outgoing, receive_timeout);
  if (!sent.ok()) std::fprintf(stderr, "troupe: bench send: %s\n", sent.detail.c_str());
  return sent.ok();
}

transport::message control_message(const std::string& text, std::map<std::string, double> metrics) {
  transport::message result;
  result.header.kind = transport::message_kind::control;
  result.header.text = text;
  result.header.metrics = std::move(metrics);
  return result;
}

transport::message latency_probe(size_t bytes) {
  transport::message probe = control_message("");
  const size_t bare = transport::encode_header(probe.header).size();
  if (bare < bytes) probe.header.text.assign(bytes - bare, 'x');
  return probe;
}

std::optional<transport::message> receive_message(transport::inbox& in,
                                                  std::chrono::milliseconds timeout) {
  std::optional<transport::decode_result> received = in.receive(timeout);
  if (!received) return std::nullopt;
  if (!received->ok()) {
    std::fprintf(stderr, "troupe: bench dropped a message: %s\n", received->error.text.c_str());
    return std::nullopt;
  }
  return std::move(*received->value);
}

}  // namespace troupe::apps::transport_bench
