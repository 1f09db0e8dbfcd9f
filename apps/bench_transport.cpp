// `troupe bench transport`: what troupe's outbox/inbox cost over raw ZeroMQ between two
// processes on tcp://127.0.0.1, measured side by side in one run: throughput of 64 KiB, 1 MiB
// and 16 MiB activations with CURVE off and on, and the round trip of a small control message.
//
// The process forks before it creates any ZeroMQ context (so run it before starting threads);
// the child receives and echoes, the parent sends. Each process binds one raw PULL socket and one
// troupe inbox per security mode and connects a raw PUSH socket and a troupe outbox to the
// other's; the ports travel over a socketpair. The parent sends commands as troupe control
// messages over the plaintext troupe pair; the child measures throughput where the data arrives
// (first message to last) and answers with the figure. Every wait has a deadline, and the child
// is always reaped.

#include <malloc.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "apps/commands.h"
#include "transport/endpoint.h"

namespace troupe::apps {
namespace {

using clock_type = std::chrono::steady_clock;

const std::vector<size_t> payload_sizes = {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20};
constexpr int rounds = 15;                      // alternating raw/troupe rounds per figure
constexpr int round_trips_per_round = 1000;     // recorded, after the warm-up ones
constexpr int warm_up_round_trips = 100;        // per round, not recorded
constexpr int64_t min_messages_per_figure = 8;  // even when the time is up
constexpr size_t control_message_bytes = 64;    // encoded header of a latency probe
constexpr std::chrono::milliseconds receive_timeout{10000};
constexpr std::chrono::milliseconds command_timeout{60000};  // child: parent gone after this
constexpr std::chrono::milliseconds answer_timeout{20000};   // parent: child gone after this
constexpr int modes_count = 2;                               // CURVE off, CURVE on

double seconds_between(clock_type::time_point from, clock_type::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string size_text(size_t bytes) {
  return bytes >= (size_t{1} << 20) ? std::to_string(bytes >> 20) + " MiB"
                                    : std::to_string(bytes >> 10) + " KiB";
}

double percentile(std::vector<double> values, double fraction) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(fraction * values.size()));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

double median(const std::vector<double>& values) { return percentile(values, 0.5); }

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

struct bench_keys {
  transport::curve_key_pair parent;
  transport::curve_key_pair child;
};

// The sockets of one process for one security mode: what it receives on, what it sends on.
struct link_sockets {
  std::unique_ptr<zmq::socket_t> raw_in;
  std::unique_ptr<zmq::socket_t> raw_out;
  std::optional<transport::inbox> troupe_in;
  std::optional<transport::outbox> troupe_out;
};

using port_list = std::array<int32_t, 2 * modes_count>;  // raw, troupe per mode

int port_of(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

// One process's side. Members are destroyed in reverse order: sockets, then the ZAP handlers,
// then the contexts, as ZeroMQ requires. One ZeroMQ I/O thread per context, raw and troupe.
class bench_peer {
 public:
  bench_peer(transport::curve_key_pair own, std::string peer_public_key, bool curve)
      : own_(std::move(own)), peer_public_key_(std::move(peer_public_key)), modes_(curve ? 2 : 1) {}

  int modes() const { return modes_; }
  link_sockets& at(bool curve) { return links_[curve ? 1 : 0]; }
  link_sockets& control() { return links_[0]; }

  // Binds every inbox, trades ports with the peer over `channel`, connects every outbox.
  bool open(int channel, std::string* error) {
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

  // Handshakes this process's ZAP handlers admitted, raw and troupe.
  std::array<double, 2> admitted() const {
    if (!raw_zap_) return {0, 0};
    return {double(raw_zap_->admitted()), double(troupe_zap_->admitted())};
  }
  // Requests they denied, both together.
  double denied() const {
    return raw_zap_ ? double(raw_zap_->denied() + troupe_zap_->denied()) : 0;
  }

 private:
  transport::endpoint_options troupe_options(bool curve) const {
    transport::endpoint_options options;
    options.security.curve = curve;
    options.security.own = own_;
    options.security.server_public_key = peer_public_key_;
    options.security.allowed_public_keys = {peer_public_key_};
    return options;
  }

  // The same high-water marks and linger as a troupe endpoint, plus timeouts on every wait.
  std::unique_ptr<zmq::socket_t> raw_socket(zmq::socket_type type) {
    const transport::endpoint_options defaults;
    auto socket = std::make_unique<zmq::socket_t>(raw_context_, type);
    socket->set(zmq::sockopt::linger, defaults.linger_ms);
    socket->set(zmq::sockopt::sndhwm, defaults.send_high_water_mark);
    socket->set(zmq::sockopt::rcvhwm, defaults.receive_high_water_mark);
    socket->set(zmq::sockopt::sndtimeo, static_cast<int>(receive_timeout.count()));
    socket->set(zmq::sockopt::rcvtimeo, static_cast<int>(receive_timeout.count()));
    return socket;
  }

  bool bind(link_sockets& into, bool curve, int32_t* ports, std::string* error) {
    into.raw_in = raw_socket(zmq::socket_type::pull);
    if (curve) {
      into.raw_in->set(zmq::sockopt::curve_server, true);
      into.raw_in->set(zmq::sockopt::curve_secretkey, own_.secret_key);
      into.raw_in->set(zmq::sockopt::zap_domain, "troupe-bench");
    }
    into.raw_in->bind("tcp://127.0.0.1:*");
    ports[0] = port_of(into.raw_in->get(zmq::sockopt::last_endpoint));
    transport::endpoint_error failure;
    into.troupe_in = transport::inbox::bind(troupe_context_, "tcp://127.0.0.1:*",
                                            troupe_options(curve), &failure);
    if (!into.troupe_in) *error = failure.text;
    if (!into.troupe_in) return false;
    ports[1] = port_of(into.troupe_in->address());
    return true;
  }

  bool connect(link_sockets& into, bool curve, const int32_t* ports, std::string* error) {
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
  static bool trade_ports(int channel, const port_list& local, port_list& remote,
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

  transport::curve_key_pair own_;
  std::string peer_public_key_;
  int modes_;
  zmq::context_t raw_context_{1};
  transport::transport_context troupe_context_{1};
  std::unique_ptr<transport::zap_authenticator> troupe_zap_;
  std::unique_ptr<raw_zap_handler> raw_zap_;
  std::array<link_sockets, modes_count> links_;
};

// ---- messages ----

bool send_whole(transport::outbox& out, const transport::message& outgoing) {
  const transport::send_result sent = out.send_waiting(outgoing, receive_timeout);
  if (!sent.ok()) std::fprintf(stderr, "troupe: bench send: %s\n", sent.detail.c_str());
  return sent.ok();
}

transport::message control_message(const std::string& text,
                                   std::map<std::string, double> metrics = {}) {
  transport::message result;
  result.header.kind = transport::message_kind::control;
  result.header.text = text;
  result.header.metrics = std::move(metrics);
  return result;
}

// A header-only control message whose encoded header is control_message_bytes long.
transport::message latency_probe() {
  transport::message probe = control_message("");
  const size_t bare = transport::encode_header(probe.header).size();
  if (bare < control_message_bytes) probe.header.text.assign(control_message_bytes - bare, 'x');
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

std::string command_text(const char* verb, bool troupe, bool curve, int64_t amount) {
  return std::string(verb) + (troupe ? " troupe " : " raw ") + (curve ? "1 " : "0 ") +
         std::to_string(amount);
}

// ---- child: receives and echoes ----

// Receives `bytes`-byte data messages until the end marker; MB/s from first message to last.
double receive_stream(link_sockets& from, bool troupe, size_t bytes) {
  int64_t count = 0;
  clock_type::time_point first, last;
  zmq::message_t part;
  while (true) {
    if (troupe) {
      auto received = receive_message(*from.troupe_in, receive_timeout);
      if (!received) return -1;
      if (received->header.kind == transport::message_kind::control) break;
      if (received->payloads.size() != 1 || received->payloads[0].bytes != bytes) return -1;
    } else {
      if (!from.raw_in->recv(part)) return -1;
      if (part.size() == 0) break;
      if (part.size() != bytes) return -1;
    }
    last = clock_type::now();
    if (count++ == 0) first = last;
  }
  if (count < 2 || last == first) return -1;
  return static_cast<double>(count - 1) * bytes / seconds_between(first, last) / 1e6;
}

bool echo(link_sockets& over, bool troupe, int count) {
  zmq::message_t part;
  for (int i = 0; i < count; ++i) {
    if (troupe) {
      auto received = receive_message(*over.troupe_in, receive_timeout);
      if (!received || !send_whole(*over.troupe_out, *received)) return false;
    } else if (!over.raw_in->recv(part) || !over.raw_out->send(part, zmq::send_flags::none)) {
      return false;
    }
  }
  return true;
}

// Serves the parent's commands ("throughput raw|troupe CURVE BYTES", "echo raw|troupe CURVE
// COUNT", "quit") until quit; returns the child's exit status.
int serve(bench_peer& peer, int cpu) {
  while (true) {
    auto command = receive_message(*peer.control().troupe_in, command_timeout);
    if (!command) return 1;
    std::istringstream words(command->header.text);
    std::string verb, implementation;
    int curve = 0;
    int64_t amount = 0;
    words >> verb >> implementation >> curve >> amount;
    std::map<std::string, double> answer;
    if (verb == "quit") {
      answer = {{"raw_admitted", peer.admitted()[0]},
                {"troupe_admitted", peer.admitted()[1]},
                {"denied", peer.denied()},
                {"cpu", cpu}};
    } else if (verb == "throughput") {
      answer["mb_per_s"] = receive_stream(peer.at(curve), implementation == "troupe", amount);
    } else if (verb == "echo") {
      answer["ok"] = echo(peer.at(curve), implementation == "troupe", static_cast<int>(amount));
    }
    if (!send_whole(*peer.control().troupe_out, control_message("answer", answer))) return 1;
    if (verb == "quit") return 0;
  }
}

int run_child(int channel, const bench_keys& keys, bool curve) {
  const int cpu = steady_process(1);  // before the contexts, so their I/O threads inherit it
  bench_peer peer(keys.child, keys.parent.public_key, curve);
  std::string error;
  if (!peer.open(channel, &error)) {
    std::fprintf(stderr, "troupe: bench receiver: %s\n", error.c_str());
    return 1;
  }
  return serve(peer, cpu);
}

// ---- parent: sends and measures ----

// The payload of every figure, allocated once and alive until the parent's sockets are gone.
struct payloads {
  std::vector<std::shared_ptr<const std::vector<float>>> values;
  payloads() {
    for (size_t bytes : payload_sizes) {
      values.push_back(std::make_shared<const std::vector<float>>(bytes / sizeof(float), 1.0f));
    }
  }
};

bool send_raw_stream(zmq::socket_t& out, const std::vector<float>& values, double seconds) {
  const auto deadline = clock_type::now() + std::chrono::duration<double>(seconds);
  const size_t bytes = values.size() * sizeof(float);
  for (int64_t sent = 0; sent < min_messages_per_figure || clock_type::now() < deadline; ++sent) {
    // A careful user's zero-copy send: no deallocation function, the buffer outlives the socket.
    zmq::message_t part(const_cast<float*>(values.data()), bytes, nullptr);
    if (!out.send(part, zmq::send_flags::none)) return false;
  }
  return out.send(zmq::message_t(), zmq::send_flags::none).has_value();
}

bool send_troupe_stream(transport::outbox& out, std::shared_ptr<const std::vector<float>> values,
                        double seconds) {
  const auto deadline = clock_type::now() + std::chrono::duration<double>(seconds);
  const auto elements = static_cast<int64_t>(values->size());
  transport::message activation;
  activation.header.kind = transport::message_kind::forward;
  transport::add_payload(activation, {elements / 1024, 1024}, std::move(values));
  for (int64_t sent = 0; sent < min_messages_per_figure || clock_type::now() < deadline; ++sent) {
    activation.header.key = static_cast<uint64_t>(sent);
    if (!send_whole(out, activation)) return false;
  }
  return send_whole(out, control_message("end"));
}

// Receiver-side MB/s of one figure, or a negative number when it failed.
double throughput(bench_peer& peer, bool troupe, bool curve,
                  const std::shared_ptr<const std::vector<float>>& values, double seconds) {
  const auto bytes = static_cast<int64_t>(values->size() * sizeof(float));
  if (!send_whole(*peer.control().troupe_out,
                  control_message(command_text("throughput", troupe, curve, bytes)))) {
    return -1;
  }
  link_sockets& to = peer.at(curve);
  const bool sent = troupe ? send_troupe_stream(*to.troupe_out, values, seconds)
                           : send_raw_stream(*to.raw_out, *values, seconds);
  auto answer = receive_message(*peer.control().troupe_in, answer_timeout);
  if (!sent || !answer || !answer->header.metrics.count("mb_per_s")) return -1;
  return answer->header.metrics.at("mb_per_s");
}

// Appends the microseconds of round_trips_per_round round trips (after a warm-up) to `into`.
bool round_trips(bench_peer& peer, bool troupe, bool curve, std::vector<double>& into) {
  const int total = warm_up_round_trips + round_trips_per_round;
  if (!send_whole(*peer.control().troupe_out,
                  control_message(command_text("echo", troupe, curve, total)))) {
    return false;
  }
  link_sockets& over = peer.at(curve);
  const transport::message probe = latency_probe();
  const std::string raw_probe(transport::encode_header(probe.header).size(), 'x');
  zmq::message_t reply;
  for (int i = 0; i < total; ++i) {
    const auto start = clock_type::now();
    const bool ok = troupe ? send_whole(*over.troupe_out, probe) &&
                                 receive_message(*over.troupe_in, receive_timeout)
                           : over.raw_out->send(zmq::buffer(raw_probe), zmq::send_flags::none) &&
                                 over.raw_in->recv(reply);
    if (!ok) return false;
    if (i >= warm_up_round_trips) into.push_back(seconds_between(start, clock_type::now()) * 1e6);
  }
  auto answer = receive_message(*peer.control().troupe_in, answer_timeout);
  return answer && answer->header.metrics["ok"] == 1;
}

struct throughput_row {
  bool curve = false;
  size_t bytes = 0;
  std::vector<double> raw, troupe;  // MB/s per round

  // troupe/raw of the rounds that ran back to back: drift that outlasts a round cancels out.
  std::vector<double> paired_ratios() const {
    std::vector<double> ratios;
    for (size_t i = 0; i < raw.size() && i < troupe.size(); ++i)
      ratios.push_back(troupe[i] / raw[i]);
    return ratios;
  }
};

struct latency_row {
  bool curve = false;
  std::vector<double> raw, troupe;  // microseconds per round trip
};

struct bench_figures {
  std::vector<throughput_row> throughput;
  std::vector<latency_row> latency;
  double raw_admitted = 0, troupe_admitted = 0, denied = 0;  // ZAP, both processes
  int sender_cpu = -1, receiver_cpu = -1;
};

// Runs `one(troupe)` for raw and troupe in ABBA order over the rounds, so that drift over the
// measurement hits both alike.
template <class measurement>
bool alternate(measurement one) {
  for (int round = 0; round < rounds; ++round) {
    for (bool troupe : {round % 2 == 1, round % 2 == 0}) {
      if (!one(troupe)) return false;
    }
  }
  return true;
}

bool measure(bench_peer& peer, const payloads& data, double seconds, bench_figures& figures) {
  for (int mode = 0; mode < peer.modes(); ++mode) {
    const bool curve = mode == 1;
    for (size_t i = 0; i < payload_sizes.size(); ++i) {
      throughput_row row{curve, payload_sizes[i], {}, {}};
      const bool ok = alternate([&](bool troupe) {
        const double figure = throughput(peer, troupe, curve, data.values[i], seconds);
        (troupe ? row.troupe : row.raw).push_back(figure);
        return figure > 0;
      });
      if (!ok) return false;
      figures.throughput.push_back(row);
    }
    latency_row row{curve, {}, {}};
    const bool ok = alternate([&](bool troupe) {
      return round_trips(peer, troupe, curve, troupe ? row.troupe : row.raw);
    });
    if (!ok) return false;
    figures.latency.push_back(row);
  }
  if (!send_whole(*peer.control().troupe_out, control_message("quit"))) return false;
  auto answer = receive_message(*peer.control().troupe_in, answer_timeout);
  if (!answer) return false;
  std::map<std::string, double>& child = answer->header.metrics;
  figures.raw_admitted = peer.admitted()[0] + child["raw_admitted"];
  figures.troupe_admitted = peer.admitted()[1] + child["troupe_admitted"];
  figures.denied = peer.denied() + child["denied"];
  figures.receiver_cpu = static_cast<int>(child["cpu"]);
  return true;
}

void print_method(double seconds, bool curve) {
  const transport::endpoint_options defaults;
  std::printf(
      "troupe bench transport: two processes, PUSH/PULL over tcp://127.0.0.1, high-water marks "
      "%d/%d\n"
      "  MB/s = 10^6 bytes/s at the receiver, first message to last, %.2f s of sending per "
      "figure; medians of %d rounds, raw and troupe alternating; ratio: median over the rounds of "
      "troupe/raw, each pair measured back to back\n"
      "  raw: cppzmq, one zero-copy frame of a preallocated buffer, blocking send/recv\n"
      "  troupe: outbox::send of a header frame + one float32 frame (shared owner), "
      "inbox::receive with decode\n"
      "  CURVE on: raw and troupe servers both admit the client key through a ZAP handler\n",
      defaults.send_high_water_mark, defaults.receive_high_water_mark, seconds, rounds);
  if (!curve) std::printf("  CURVE is not available in this libzmq: CURVE-on rows skipped\n");
  std::fflush(stdout);
}

void print(const bench_figures& figures) {
  if (figures.sender_cpu >= 0 && figures.receiver_cpu >= 0) {
    std::printf("  sender pinned to CPU %d, receiver to CPU %d; glibc heap trimming off in both\n",
                figures.sender_cpu, figures.receiver_cpu);
  } else {
    std::printf("  processes not pinned (fewer than 2 CPUs); glibc heap trimming off in both\n");
  }
  for (const throughput_row& row : figures.throughput) {
    if (row.bytes == payload_sizes.front()) {
      std::printf("\n  throughput, CURVE %s\n", row.curve ? "on" : "off");
      std::printf("      size    raw MB/s  troupe MB/s  ratio  >= 0.90  paired ratios p25..p75\n");
    }
    const double raw = median(row.raw), troupe = median(row.troupe);
    const double ratio = median(row.paired_ratios());
    std::printf("    %6s  %10.0f  %11.0f  %5.2f  %-6s  %.2f..%.2f\n", size_text(row.bytes).c_str(),
                raw, troupe, ratio, ratio >= 0.9 ? "yes" : "NO",
                percentile(row.paired_ratios(), 0.25), percentile(row.paired_ratios(), 0.75));
  }
  std::printf("\n  round trip of a %zu-byte control message (%d x %d each), microseconds\n",
              control_message_bytes, rounds, round_trips_per_round);
  std::printf("                raw median   raw p99   troupe median   troupe p99\n");
  for (const latency_row& row : figures.latency) {
    std::printf("    CURVE %-3s  %10.1f  %8.1f  %14.1f  %11.1f\n", row.curve ? "on" : "off",
                median(row.raw), percentile(row.raw, 0.99), median(row.troupe),
                percentile(row.troupe, 0.99));
  }
  std::printf("\n  ZAP handshakes admitted: raw %.0f, troupe %.0f; requests denied: %.0f\n",
              figures.raw_admitted, figures.troupe_admitted, figures.denied);
}

void write_json(const bench_figures& figures, double seconds, const std::string& file) {
  nlohmann::json result = {{"figure_seconds", seconds},
                           {"rounds", rounds},
                           {"sender_cpu", figures.sender_cpu},
                           {"receiver_cpu", figures.receiver_cpu},
                           {"zap_raw_admitted", figures.raw_admitted},
                           {"zap_troupe_admitted", figures.troupe_admitted},
                           {"zap_denied", figures.denied}};
  for (const throughput_row& row : figures.throughput) {
    const double raw = median(row.raw), troupe = median(row.troupe);
    result["throughput"].push_back({{"curve", row.curve},
                                    {"bytes", row.bytes},
                                    {"raw_mb_per_s", raw},
                                    {"troupe_mb_per_s", troupe},
                                    {"ratio", median(row.paired_ratios())},
                                    {"ratio_of_medians", troupe / raw},
                                    {"paired_ratio_p25", percentile(row.paired_ratios(), 0.25)},
                                    {"paired_ratio_p75", percentile(row.paired_ratios(), 0.75)},
                                    {"raw_rounds", row.raw},
                                    {"troupe_rounds", row.troupe}});
  }
  for (const latency_row& row : figures.latency) {
    result["latency"].push_back({{"curve", row.curve},
                                 {"message_bytes", control_message_bytes},
                                 {"round_trips", row.raw.size()},
                                 {"raw_median_us", median(row.raw)},
                                 {"raw_p99_us", percentile(row.raw, 0.99)},
                                 {"troupe_median_us", median(row.troupe)},
                                 {"troupe_p99_us", percentile(row.troupe, 0.99)}});
  }
  std::ofstream(file) << result.dump(2) << "\n";
}

int run_parent(int channel, const bench_keys& keys, bool curve, const bench_options& options) {
  const double seconds = std::max(0.05, options.seconds / 30);
  print_method(seconds, curve);
  bench_figures figures;
  figures.sender_cpu = steady_process(0);
  const payloads data;  // outlives the sockets, which may still hold zero-copy references
  {
    bench_peer peer(keys.parent, keys.child.public_key, curve);
    std::string error;
    if (!peer.open(channel, &error) || !measure(peer, data, seconds, figures)) {
      std::fprintf(stderr, "troupe: bench transport failed%s%s\n", error.empty() ? "" : ": ",
                   error.c_str());
      return 1;
    }
  }
  print(figures);
  if (!options.json_file.empty()) write_json(figures, seconds, options.json_file);
  return 0;
}

// Waits up to 10 s for the child to exit (not at all after a failure), then kills it; either
// way it is reaped.
void reap(pid_t child, bool failed) {
  if (failed) kill(child, SIGKILL);
  const auto deadline = clock_type::now() + std::chrono::seconds(10);
  while (waitpid(child, nullptr, WNOHANG) == 0) {
    if (clock_type::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, nullptr, 0);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// zmq_curve_keypair needs no context, so the keys can be made before the fork.
std::optional<bench_keys> make_keys(bool curve) {
  if (!curve) return bench_keys{};
  std::string error;
  auto parent = transport::generate_key_pair(&error);
  auto child = transport::generate_key_pair(&error);
  if (parent && child) return bench_keys{*parent, *child};
  std::fprintf(stderr, "troupe: bench transport: %s\n", error.c_str());
  return std::nullopt;
}

// The child's whole life: serve the parent over `channel`, close its contexts, exit.
[[noreturn]] void be_receiver(pid_t parent, int channel, const bench_keys& keys, bool curve) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);   // a parent killed mid-run takes the child with it
  if (getppid() != parent) _exit(1);  // it already was
  int status = 1;
  try {
    status = run_child(channel, keys, curve);  // returns once its contexts are closed
  } catch (const std::exception& failure) {
    std::fprintf(stderr, "troupe: bench receiver: %s\n", failure.what());
  }
  std::fflush(stderr);
  _exit(status);
}

}  // namespace

int run_bench_transport(const bench_options& options) {
  const bool curve = transport::curve_available();
  const std::optional<bench_keys> keys = make_keys(curve);
  if (!keys) return 1;
  int channel[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, channel) != 0) {
    std::perror("troupe: bench transport: socketpair");
    return 1;
  }
  std::fflush(stdout);  // the child would hold a copy of anything still buffered
  std::fflush(stderr);
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child == 0) {
    close(channel[0]);
    be_receiver(parent, channel[1], *keys, curve);
  }
  close(channel[1]);
  int status = 1;
  if (child < 0) {
    std::perror("troupe: bench transport: fork");
  } else {
    try {
      status = run_parent(channel[0], *keys, curve, options);
    } catch (const std::exception& failure) {
      std::fprintf(stderr, "troupe: bench transport: %s\n", failure.what());
    }
    reap(child, status != 0);
  }
  close(channel[0]);
  return status;
}

}  // namespace troupe::apps
