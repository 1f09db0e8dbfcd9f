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

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "apps/bench/bench_transport_peer.h"
#include "apps/cli/commands.h"
#include "transport/endpoint.h"

namespace troupe::apps {
namespace {

using namespace transport_bench;

using clock_type = std::chrono::steady_clock;

const std::vector<size_t> payload_sizes = {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20};
constexpr int rounds = 15;                      // alternating raw/troupe rounds per figure
constexpr int round_trips_per_round = 1000;     // recorded, after the warm-up ones
constexpr int warm_up_round_trips = 100;        // per round, not recorded
constexpr int64_t min_messages_per_figure = 8;  // even when the time is up
constexpr size_t control_message_bytes = 64;    // encoded header of a latency probe
constexpr std::chrono::milliseconds command_timeout{60000};  // child: parent gone after this
constexpr std::chrono::milliseconds answer_timeout{20000};   // parent: child gone after this

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

// ---- messages ----

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
  const transport::message probe = latency_probe(control_message_bytes);
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
