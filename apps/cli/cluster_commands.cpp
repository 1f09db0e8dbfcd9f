// `troupe worker`, `troupe keygen` and `troupe launch`: a worker process that joins a
// coordinator, keys for a cluster's CURVE security, and the entry point that every rank of an
// existing launcher (srun, mpirun, torchrun, a hostfile) runs.

#include <arpa/inet.h>
#include <netdb.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "actors/cluster/cluster_host.h"
#include "actors/cluster/key_files.h"
#include "actors/config/job_file.h"
#include "actors/hosts/steady_clock.h"
#include "apps/cli/commands.h"
#include "apps/cli/launch_environment.h"
#include "apps/cli/local_workers.h"
#include "apps/cli/run_signals.h"
#include "transport/curve.h"

namespace troupe::apps {
namespace {

std::string this_host() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

/// The numeric address of `host` (ZeroMQ binds interfaces and addresses, not names); the
/// name itself when it does not resolve (the bind then reports the error).
std::string numeric_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return host;
  char text[INET6_ADDRSTRLEN] = {};
  const void* address =
      found->ai_family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(found->ai_addr)->sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr);
  inet_ntop(found->ai_family, address, text, sizeof text);
  freeaddrinfo(found);
  return text;
}

/// "tcp://HOST:PORT", bracketing IPv6 addresses.
std::string tcp_address(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

std::optional<transport::security_settings> security_from(const std::string& directory,
                                                          const std::string& name, bool insecure,
                                                          std::string* error) {
  transport::security_settings security;
  security.allow_insecure = insecure;
  if (directory.empty()) return security;
  auto own = transport::read_key_pair(directory, name.empty() ? this_host() : name, error);
  if (!own) return std::nullopt;
  auto allowed = transport::read_public_keys(directory, error);
  if (!allowed) return std::nullopt;
  security.curve = true;
  security.own = *own;
  security.allowed_public_keys = *allowed;
  return security;
}

std::optional<std::string> public_key_named(const std::string& directory, const std::string& name,
                                            std::string* error) {
  const std::string path = directory + "/" + name + ".pub";
  std::ifstream file(path);
  std::string key;
  if (!(file >> key) || key.size() != 40) {
    *error = path + ": missing or not a 40-character CURVE public key";
    return std::nullopt;
  }
  return key;
}

int run_worker_command(const worker_command_options& options) {
  actors::steady_clock clock;
  actors::worker_options worker;
  worker.coordinator_address = options.coordinator;
  worker.listen_address = options.listen;
  worker.liveness.timeout_s = options.heartbeat_timeout_s;
  worker.job_hash = options.job_hash;
  worker.run_secret = run_secret_from_environment();
  worker.stop_requests = install_worker_signals();
  std::string error;
  auto security = security_from(options.keys_directory, options.key_name, options.insecure, &error);
  if (!security) {
    std::fprintf(stderr, "troupe worker: %s\n", error.c_str());
    return 2;
  }
  worker.security = *security;
  if (security->curve) {
    auto key = public_key_named(options.keys_directory, options.coordinator_key_name, &error);
    if (!key) {
      std::fprintf(stderr, "troupe worker: %s\n", error.c_str());
      return 2;
    }
    worker.coordinator_key = *key;
  }
  const int status = actors::run_worker(worker, clock, &error);
  if (status != 0) std::fprintf(stderr, "troupe worker: %s\n", error.c_str());
  return status;
}

int run_keygen(const keygen_options& options) {
  const std::string name = options.name.empty() ? this_host() : options.name;
  std::string error;
  auto pair = transport::generate_key_pair(&error);
  if (!pair || !actors::write_key_pair(options.directory, name, *pair, &error)) {
    std::fprintf(stderr, "troupe keygen: %s\n", error.c_str());
    return 2;
  }
  std::printf(
      "wrote %s/%s.key (secret) and %s/%s.pub; copy every node's .pub into each "
      "node's key directory\n",
      options.directory.c_str(), name.c_str(), options.directory.c_str(), name.c_str());
  return 0;
}

int run_launch(const launch_options& options) {
  std::string error;
  auto environment = detect_launch_environment(&error);
  if (!environment) {
    std::fprintf(stderr, "troupe launch: %s\n", error.c_str());
    return 2;
  }
  train_options train = options.train;
  if (environment->world_size == 1) return run_train(train);
  std::string host = environment->coordinator_host;
  if (host.empty()) host = environment->hosts.empty() ? "127.0.0.1" : environment->hosts.front();
  const int port =
      environment->coordinator_port > 0 ? environment->coordinator_port : options.default_port;
  const std::string coordinator = tcp_address(numeric_host(host), port);
  std::fprintf(stderr, "troupe launch: %s rank %d of %d, coordinator at %s\n",
               environment->launcher.c_str(), environment->rank, environment->world_size,
               coordinator.c_str());
  if (environment->rank == 0) {
    train.listen = coordinator;
    train.workers = environment->world_size - 1;
    if (!options.worker_key_name.empty()) train.key_name = options.worker_key_name;
    return run_train(train);
  }
  worker_command_options worker;
  worker.coordinator = coordinator;
  const std::string own_host =
      static_cast<int>(environment->hosts.size()) > environment->rank
          ? environment->hosts[environment->rank]
          : (host == "127.0.0.1" || host == "localhost" ? host : this_host());
  worker.listen = tcp_address(numeric_host(own_host), 0);
  worker.listen.replace(worker.listen.size() - 1, 1, "*");
  worker.heartbeat_timeout_s = train.heartbeat_timeout_s;
  worker.keys_directory = train.keys_directory;
  worker.insecure = train.insecure;
  worker.key_name = options.worker_key_name;
  // Every rank reads the job file: the coordinator refuses a rank started for another job.
  actors::job_error problem;
  auto config = actors::load_job_file(train.job_file, train.overrides, &problem);
  if (!config) {
    std::fprintf(stderr, "troupe launch: %s\n", problem.message.c_str());
    return 2;
  }
  worker.job_hash = actors::job_identity_hash(*config);
  return run_worker_command(worker);
}

}  // namespace troupe::apps
