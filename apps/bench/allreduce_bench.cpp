// troupe-allreduce-bench: troupe's CPU ring all-reduce (the engine's ring machine, its pieces
// in the engine's wire format as gradient_chunk messages over ZeroMQ tcp on loopback) against
// Gloo's ring all-reduce (AllreduceRing and AllreduceRingChunked over Gloo's own tcp
// transport), one thread per rank, alternating rounds, for 1 MiB ... 256 MiB of float32. Prints
// each one's median bus bandwidth (nccl-tests' definition: bytes / time · 2 (ranks − 1) /
// ranks) and troupe's ratio to the better Gloo algorithm, with CURVE off and on. Gloo is a
// benchmark-only reference here: the engine never links it.

#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/engine/ring_all_reduce.h"
#include "actors/hosts/wire_format.h"
#include "layers/backend_registry.h"
#include "layers/thread_barrier.h"
#include "transport/curve.h"
#include "transport/endpoint.h"

namespace {

using troupe::actors::ring_all_reduce;
using troupe::actors::ring_chunk;
namespace transport = troupe::transport;

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/// Rank `rank`'s contribution at position `i`: small integers, distinct across ranks and
/// positions (repeating every 64 positions), so that every sum is exact in float32 and a value
/// summed into the wrong place, missed or counted twice shows.
float contribution(int rank, int64_t i) { return static_cast<float>((i * 7 + rank * 13) % 64); }

/// Buffers of `ranks` ranks of `floats` values each, filled with their contributions.
std::vector<std::vector<float>> contributions(int ranks, int64_t floats) {
  std::vector<std::vector<float>> buffers(ranks, std::vector<float>(floats));
  for (int r = 0; r < ranks; ++r) {
    for (int64_t i = 0; i < floats; ++i) buffers[r][i] = contribution(r, i);
  }
  return buffers;
}

/// Exits with a line naming the first wrong value unless every element of every rank's buffer
/// holds what `rounds` all-reduces in place make of the contributions: their sum, times the
/// rank count for each round after the first.
void check_sums(const char* what, const std::vector<std::vector<float>>& buffers, int rounds) {
  const int ranks = static_cast<int>(buffers.size());
  std::vector<float> expected(64);
  for (int64_t i = 0; i < 64; ++i) {
    double sum = 0;
    for (int r = 0; r < ranks; ++r) sum += contribution(r, i);
    expected[i] = static_cast<float>(sum * std::pow(ranks, rounds - 1));
  }
  for (int r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < buffers[r].size(); ++i) {
      if (buffers[r][i] == expected[i % 64]) continue;
      std::fprintf(stderr, "troupe-allreduce-bench: %s: rank %d summed wrong at %zu: %g, not %g\n",
                   what, r, i, buffers[r][i], expected[i % 64]);
      std::exit(1);
    }
  }
}

/// One round of every rank, each in its own thread, started together; returns the slowest
/// rank's time per round, `rounds` times (the first warms the connections up: callers drop it).
std::vector<double> time_rounds(int ranks, int rounds, const std::function<void(int rank)>& setup,
                                const std::function<void(int rank)>& round) {
  std::vector<std::vector<double>> seconds(ranks, std::vector<double>(rounds));
  troupe::layers::thread_barrier together(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      setup(r);
      for (int i = 0; i < rounds; ++i) {
        together.arrive_and_wait();
        const double start = now_s();
        round(r);
        seconds[r][i] = now_s() - start;
      }
      together.arrive_and_wait();
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<double> slowest(rounds, 0);
  for (int i = 0; i < rounds; ++i) {
    for (int r = 0; r < ranks; ++r) slowest[i] = std::max(slowest[i], seconds[r][i]);
  }
  return slowest;
}

/// Gloo's ring: `chunked` picks AllreduceRingChunked (reduce-scatter and all-gather in
/// pipelined chunks) over AllreduceRing (the whole buffer around the ring R − 1 times).
std::vector<double> gloo_rounds(int ranks, int64_t floats, int rounds, bool chunked) {
  gloo::rendezvous::HashStore store;
  std::vector<std::vector<float>> buffers = contributions(ranks, floats);
  std::vector<std::shared_ptr<gloo::rendezvous::Context>> contexts(ranks);
  std::vector<std::unique_ptr<gloo::Algorithm>> algorithms(ranks);
  const auto setup = [&](int rank) {
    auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");
    contexts[rank] = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
    contexts[rank]->connectFullMesh(store, device);
    std::vector<float*> pointers{buffers[rank].data()};
    if (chunked) {
      algorithms[rank] = std::make_unique<gloo::AllreduceRingChunked<float>>(
          contexts[rank], pointers, static_cast<int>(floats));
    } else {
      algorithms[rank] = std::make_unique<gloo::AllreduceRing<float>>(contexts[rank], pointers,
                                                                      static_cast<int>(floats));
    }
  };
  std::vector<double> times =
      time_rounds(ranks, rounds, setup, [&](int rank) { algorithms[rank]->run(); });
  check_sums(chunked ? "gloo chunked" : "gloo ring", buffers, rounds);
  return times;
}

/// troupe's ring: rank r's inbox on a loopback tcp port, its outbox to rank r + 1's inbox.
std::vector<double> troupe_rounds(int ranks, int64_t floats, int rounds, bool curve) {
  std::vector<std::unique_ptr<transport::transport_context>> contexts;
  std::vector<std::optional<transport::inbox>> inboxes(ranks);
  std::vector<std::optional<transport::outbox>> outboxes(ranks);
  std::vector<transport::curve_key_pair> keys(ranks);
  std::vector<std::unique_ptr<transport::zap_authenticator>> authenticators(ranks);
  std::string error;
  for (int r = 0; r < ranks; ++r) {
    contexts.push_back(std::make_unique<transport::transport_context>());
    if (curve) keys[r] = *transport::generate_key_pair(&error);
  }
  for (int r = 0; curve && r < ranks; ++r) {
    authenticators[r] = transport::zap_authenticator::start(*contexts[r], &error);
    if (!authenticators[r] ||
        !authenticators[r]->allow({keys[(r + ranks - 1) % ranks].public_key}, &error)) {
      std::fprintf(stderr, "troupe-allreduce-bench: %s\n", error.c_str());
      std::exit(1);
    }
  }
  transport::endpoint_options options;
  options.send_high_water_mark = options.receive_high_water_mark = 1 << 10;
  for (int r = 0; r < ranks; ++r) {
    transport::endpoint_options own = options;
    if (curve) {
      own.security.curve = true;
      own.security.own = keys[r];
      own.security.allowed_public_keys = {keys[(r + ranks - 1) % ranks].public_key};
    }
    transport::endpoint_error problem;
    inboxes[r] = transport::inbox::bind(*contexts[r], "tcp://127.0.0.1:*", own, &problem);
    if (!inboxes[r]) {
      std::fprintf(stderr, "troupe-allreduce-bench: %s\n", problem.text.c_str());
      std::exit(1);
    }
  }
  for (int r = 0; r < ranks; ++r) {
    const int next = (r + 1) % ranks;
    transport::endpoint_options own = options;
    if (curve) {
      own.security.curve = true;
      own.security.own = keys[r];
      own.security.server_public_key = keys[next].public_key;
    }
    transport::endpoint_error problem;
    outboxes[r] = transport::outbox::connect(*contexts[r], inboxes[next]->address(), own, &problem);
    if (!outboxes[r]) {
      std::fprintf(stderr, "troupe-allreduce-bench: %s\n", problem.text.c_str());
      std::exit(1);
    }
  }
  std::vector<std::vector<float>> buffers = contributions(ranks, floats);
  std::vector<std::unique_ptr<ring_all_reduce>> rings(ranks);
  // The engine's own wire format for the pieces (actors/hosts/wire_format.h).
  std::string backend_error;
  auto host = troupe::layers::create_backend("cpu", 1, &backend_error);
  const auto send = [&](int rank, const std::vector<ring_chunk>& chunks) {
    const troupe::actors::wire_route route{0, rank, (rank + 1) % ranks, 0, 0};
    for (const ring_chunk& chunk : chunks) {
      outboxes[rank]->send_waiting(
          troupe::actors::to_wire(troupe::actors::reduce_message(chunk), route),
          std::chrono::milliseconds(-1));
    }
  };
  const auto round = [&](int rank) {
    ring_all_reduce& ring = *rings[rank];
    send(rank, ring.start(buffers[rank]));
    while (!ring.finished()) {
      auto received = inboxes[rank]->receive(std::chrono::milliseconds(-1));
      if (!received || !received->ok()) continue;
      std::string refusal;
      auto piece = troupe::actors::key_from_wire(*received->value, *host, &refusal);
      std::vector<ring_chunk> next;
      if (!piece || !ring.receive(troupe::actors::chunk_of(*piece), &next, &refusal)) {
        std::fprintf(stderr, "troupe-allreduce-bench: %s\n", refusal.c_str());
        std::exit(1);
      }
      send(rank, next);
    }
    buffers[rank] = ring.take_result();
  };
  const auto setup = [&](int rank) {
    rings[rank] = std::make_unique<ring_all_reduce>(rank, ranks, floats);
  };
  std::vector<double> times = time_rounds(ranks, rounds, setup, round);
  for (auto& authenticator : authenticators) {
    if (authenticator) authenticator->stop();
  }
  check_sums(curve ? "troupe+CURVE" : "troupe", buffers, rounds);
  return times;
}

}  // namespace

int main(int argc, char** argv) {
  // As troupe's own main: freed blocks up to 32 MiB are kept for reuse, not unmapped.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  int ranks = 2, rounds = 5;
  std::vector<int64_t> sizes_mib{1, 4, 16, 64, 256};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--ranks" && i + 1 < argc) {
      ranks = std::atoi(argv[++i]);
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (arg == "--max-mib" && i + 1 < argc) {
      const int64_t most = std::atoll(argv[++i]);
      sizes_mib.erase(std::remove_if(sizes_mib.begin(), sizes_mib.end(),
                                     [most](int64_t size) { return size > most; }),
                      sizes_mib.end());
    } else {
      std::fprintf(stderr,
                   "usage: troupe-allreduce-bench [--ranks R] [--rounds N] [--max-mib M]\n"
                   "  R ranks (threads, default 2) all-reduce float32 buffers of 1 ... 256 MiB "
                   "over loopback tcp; N timed rounds of each (default 5), alternating.\n");
      return 2;
    }
  }
  if (ranks < 2 || rounds < 1 || sizes_mib.empty()) {
    std::fprintf(stderr, "troupe-allreduce-bench: needs --ranks >= 2, --rounds >= 1, sizes\n");
    return 2;
  }
  const bool curve = transport::curve_available();
  std::printf(
      "ring all-reduce, %d ranks on loopback tcp, float32, median of %d rounds; bus "
      "bandwidth in GB/s\n",
      ranks, rounds);
  std::printf("%8s %12s %12s %12s %12s %8s\n", "MiB", "gloo ring", "gloo chunked", "troupe",
              "troupe+CURVE", "ratio");
  for (int64_t mib : sizes_mib) {
    const int64_t floats = mib * (int64_t{1} << 20) / 4;
    std::vector<double> gloo_plain, gloo_chunked, ours, ours_curve;
    // Alternating rounds, one of each at a time, so that the machine's drifts hit all alike.
    for (int i = 0; i < rounds; ++i) {
      // Each time fresh connections, warmed up by an untimed round.
      gloo_plain.push_back(gloo_rounds(ranks, floats, 2, false).back());
      gloo_chunked.push_back(gloo_rounds(ranks, floats, 2, true).back());
      ours.push_back(troupe_rounds(ranks, floats, 2, false).back());
      if (curve) ours_curve.push_back(troupe_rounds(ranks, floats, 2, true).back());
    }
    const double bytes = static_cast<double>(floats) * 4;
    const double factor = 2.0 * (ranks - 1) / ranks;
    const auto bus = [&](const std::vector<double>& seconds) {
      return seconds.empty() ? 0.0 : bytes / median(seconds) * factor / 1e9;
    };
    const double best_gloo = std::max(bus(gloo_plain), bus(gloo_chunked));
    std::printf("%8lld %12.2f %12.2f %12.2f %12.2f %7.2fx\n", static_cast<long long>(mib),
                bus(gloo_plain), bus(gloo_chunked), bus(ours), bus(ours_curve),
                bus(ours) / best_gloo);
    std::fflush(stdout);
  }
  return 0;
}
