#include "apps/cli/launch_environment.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string_view>

namespace troupe::apps {
namespace {

/// Sets `error` (when not null) to `message` and returns false.
bool report(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return false;
}

/// As report, for functions that return an optional.
std::nullopt_t fail(std::string* error, std::string message) {
  report(error, std::move(message));
  return std::nullopt;
}

/// A variable's name and value, for messages that show both.
struct named_value {
  std::string name;
  std::string value;
};

std::string show(const named_value& variable) {
  return variable.name + "='" + variable.value + "'";
}

/// The first of `names` that is set.
std::optional<named_value> first_set(const variable_lookup& get,
                                     std::initializer_list<const char*> names) {
  for (const char* name : names) {
    if (auto value = get(name)) return named_value{name, *value};
  }
  return std::nullopt;
}

/// The variables that give a launcher's rank, world size and (optionally) local rank.
struct rank_variables {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
};

constexpr rank_variables torchrun_variables = {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"};
constexpr rank_variables mpi_variables[] = {
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"pmix", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
};

/// A launch_environment being filled in, with what the later steps need to know.
struct detection {
  launch_environment environment;
  bool local_rank_known = false;
  std::string launcher_host;  ///< the coordinator host that the launcher itself names
};

/// The variable `name` as an integer of at least `min` (0 or 1).
std::optional<int> read_count(const variable_lookup& get, const char* name, int min,
                              std::string* error) {
  const named_value variable{name, get(name).value_or("")};
  const auto value = parse_decimal(variable.value, min, INT_MAX);
  if (!value) {
    return fail(error, show(variable) + (min == 0 ? " is not a non-negative integer"
                                                  : " is not a positive integer"));
  }
  return static_cast<int>(*value);
}

/// Fails unless the variable `name`, holding `value`, is below the world size in `size`.
bool check_below_size(const variable_lookup& get, const char* name, int value, const char* size,
                      int world_size, std::string* error) {
  if (value < world_size) return true;
  return report(error, show({name, get(name).value_or("")}) + " is not less than " +
                           show({size, get(size).value_or("")}));
}

std::optional<detection> read_ranks(const variable_lookup& get, const rank_variables& names,
                                    std::string* error) {
  detection found;
  found.environment.launcher = names.launcher;
  const auto world = read_count(get, names.size, 1, error);
  const auto rank = world ? read_count(get, names.rank, 0, error) : std::nullopt;
  if (!rank || !check_below_size(get, names.rank, *rank, names.size, *world, error))
    return std::nullopt;
  found.environment.world_size = *world;
  found.environment.rank = *rank;
  if (get(names.local_rank)) {
    const auto local = read_count(get, names.local_rank, 0, error);
    if (!local || !check_below_size(get, names.local_rank, *local, names.size, *world, error)) {
      return std::nullopt;
    }
    found.environment.local_rank = *local;
    found.local_rank_known = true;
  }
  return found;
}

/// How Slurm spread tasks over nodes, from the node part of SLURM_DISTRIBUTION.
enum class slurm_placement { block, cyclic, other, arbitrary };

slurm_placement read_placement(const variable_lookup& get) {
  const std::string value = get("SLURM_DISTRIBUTION").value_or("block");
  const std::string nodes = value.substr(0, value.find_first_of(":,"));
  if (nodes == "block" || nodes == "*" || nodes.empty()) return slurm_placement::block;
  if (nodes == "cyclic") return slurm_placement::cyclic;
  return nodes == "arbitrary" ? slurm_placement::arbitrary : slurm_placement::other;
}

/// One host per rank: node i holds counts[i] ranks, dealt in blocks or round robin.
host_names place_ranks(const host_names& nodes, std::vector<int> counts, bool cyclic) {
  std::vector<std::string> hosts;
  for (bool placed = true; placed;) {
    placed = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const int take = cyclic ? std::min(counts[i], 1) : counts[i];
      hosts.insert(hosts.end(), take, nodes[i]);
      counts[i] -= take;
      placed = placed || take > 0;
    }
  }
  return hosts;
}

/// Fills in the hosts of a Slurm step from its tasks per node, checked against the nodelist
/// and the task count in `size`.
bool place_slurm_ranks(const variable_lookup& get, const named_value& nodelist,
                       const host_names& nodes, const char* size, detection* found,
                       std::string* error) {
  const auto tasks = first_set(get, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  const slurm_placement placement = read_placement(get);
  if (placement == slurm_placement::arbitrary) found->launcher_host.clear();  // rank 0: anywhere
  if (!tasks || placement >= slurm_placement::other) return true;
  std::string problem;
  const auto counts = expand_tasks_per_node(tasks->value, &problem);
  if (!counts) return report(error, tasks->name + ": " + problem);
  if (counts->size() != nodes.size()) {
    return report(error, show(*tasks) + " describes " + std::to_string(counts->size()) +
                             " nodes but " + show(nodelist) + " has " +
                             std::to_string(nodes.size()));
  }
  const int64_t total = std::accumulate(counts->begin(), counts->end(), int64_t{0});
  if (total != found->environment.world_size) {
    return report(error, show(*tasks) + " adds up to " + std::to_string(total) + " tasks but " +
                             show({size, get(size).value_or("")}));
  }
  found->environment.hosts = place_ranks(nodes, *counts, placement == slurm_placement::cyclic);
  return true;
}

std::optional<detection> detect_slurm(const variable_lookup& get, std::string* error) {
  const char* size = get("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
  auto found = read_ranks(get, {"slurm", "SLURM_PROCID", size, "SLURM_LOCALID"}, error);
  // The step's own variables first: a step may run on fewer nodes than the job holds.
  const auto nodelist =
      first_set(get, {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"});
  if (!found || !nodelist) return found;
  std::string problem;
  const auto nodes = expand_hostlist(nodelist->value, &problem);
  if (!nodes) return fail(error, nodelist->name + ": " + problem);
  found->launcher_host = nodes->front();
  if (!place_slurm_ranks(get, *nodelist, *nodes, size, &*found, error)) return std::nullopt;
  return found;
}

std::optional<host_names> load_hostfile(const std::string& path, const file_reader& read,
                                        std::string* error) {
  std::string problem;
  const auto text = read(path, &problem);
  if (!text) return fail(error, show({"TROUPE_HOSTFILE", path}) + ": " + problem);
  auto hosts = read_hostfile(*text, path, &problem);
  if (!hosts) return fail(error, "TROUPE_HOSTFILE: " + problem);
  return hosts;
}

std::optional<detection> detect_hostfile(const variable_lookup& get, const file_reader& read,
                                         std::string* error) {
  const auto path = get("TROUPE_HOSTFILE");
  if (!path) return fail(error, "TROUPE_RANK is set but TROUPE_HOSTFILE is not; set both");
  if (!get("TROUPE_RANK")) return fail(error, "TROUPE_HOSTFILE is set but TROUPE_RANK is not");
  auto hosts = load_hostfile(*path, read, error);
  const auto rank = hosts ? read_count(get, "TROUPE_RANK", 0, error) : std::nullopt;
  if (!rank) return std::nullopt;
  if (*rank >= static_cast<int>(hosts->size())) {
    return fail(error, show({"TROUPE_RANK", *get("TROUPE_RANK")}) + " is not less than the " +
                           std::to_string(hosts->size()) + " slots of " +
                           show({"TROUPE_HOSTFILE", *path}));
  }
  detection found;
  found.environment.launcher = "hostfile";
  found.environment.rank = *rank;
  found.environment.world_size = static_cast<int>(hosts->size());
  found.environment.hosts = std::move(*hosts);
  return found;
}

/// An MPI launcher's ranks; Slurm's instead when they agree, since Slurm also knows the hosts.
std::optional<detection> detect_mpi(const variable_lookup& get, const rank_variables& names,
                                    std::string* error) {
  auto found = read_ranks(get, names, error);
  if (!found) return std::nullopt;
  found->launcher_host = get("MASTER_ADDR").value_or("");
  if (get("SLURM_PROCID")) {
    std::string ignored;
    auto slurm = detect_slurm(get, &ignored);
    if (slurm && slurm->environment.rank == found->environment.rank &&
        slurm->environment.world_size == found->environment.world_size) {
      return slurm;
    }
  }
  return found;
}

/// The launcher and the ranks it gives, before hosts and the coordinator are settled.
std::optional<detection> detect_launcher(const variable_lookup& get, const file_reader& read,
                                         std::string* error) {
  if (get("RANK") && get("WORLD_SIZE")) {
    auto found = read_ranks(get, torchrun_variables, error);
    if (found) found->launcher_host = get("MASTER_ADDR").value_or("");
    return found;
  }
  for (const rank_variables& names : mpi_variables) {
    if (get(names.rank) && get(names.size)) return detect_mpi(get, names, error);
  }
  if (get("SLURM_PROCID") && (get("SLURM_NTASKS") || get("SLURM_NPROCS"))) {
    return detect_slurm(get, error);
  }
  if (get("TROUPE_HOSTFILE") || get("TROUPE_RANK")) return detect_hostfile(get, read, error);
  return detection{};
}

/// Splits "host", "host:port", "[v6]" or "[v6]:port"; a bare address with several colons is
/// IPv6 without a port. Nothing when the host is empty or a bracket is unclosed.
std::optional<std::pair<std::string, std::optional<std::string>>> split_host_port(
    const std::string& text) {
  std::string host = text;
  size_t colon = std::string::npos;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos) return std::nullopt;
    if (close + 1 < text.size() && text[close + 1] != ':') return std::nullopt;
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) colon = close + 1;
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    colon = text.find(':');
    host = text.substr(0, colon);
  }
  if (host.empty()) return std::nullopt;
  std::optional<std::string> port;
  if (colon != std::string::npos) port = text.substr(colon + 1);
  return std::make_pair(host, port);
}

/// Settles coordinator_host and coordinator_port from TROUPE_COORDINATOR,
/// TROUPE_COORDINATOR_PORT, MASTER_PORT, the launcher and the hosts.
bool resolve_coordinator(const variable_lookup& get, detection* found, std::string* error) {
  launch_environment& environment = found->environment;
  environment.coordinator_host = found->launcher_host;
  if (environment.coordinator_host.empty() && !environment.hosts.empty()) {
    environment.coordinator_host = environment.hosts.front();
  }
  std::optional<named_value> port_variable;
  std::string port_text;
  if (const auto coordinator = first_set(get, {"TROUPE_COORDINATOR"})) {
    const auto parts = split_host_port(coordinator->value);
    if (!parts) return report(error, show(*coordinator) + " is not host[:port]");
    environment.coordinator_host = parts->first;
    if (parts->second) {
      port_variable = coordinator;
      port_text = *parts->second;
    }
  }
  if (!port_variable) {
    port_variable = first_set(get, {"TROUPE_COORDINATOR_PORT", "MASTER_PORT"});
    if (port_variable) port_text = port_variable->value;
  }
  if (!port_variable) return true;
  const auto port = parse_decimal(port_text, 1, 65535);
  if (!port) {
    return report(error, show(*port_variable) + ": port '" + port_text + "' is not in 1-65535");
  }
  environment.coordinator_port = static_cast<int>(*port);
  return true;
}

/// Adds hosts from TROUPE_HOSTFILE when the launcher gave none, then the local rank and the
/// coordinator.
bool complete(const variable_lookup& get, const file_reader& read, detection* found,
              std::string* error) {
  launch_environment& environment = found->environment;
  const auto path = get("TROUPE_HOSTFILE");
  if (environment.hosts.empty() && path) {
    auto hosts = load_hostfile(*path, read, error);
    if (!hosts) return false;
    if (hosts->size() != static_cast<size_t>(environment.world_size)) {
      return report(error, show({"TROUPE_HOSTFILE", *path}) + " has " +
                               std::to_string(hosts->size()) + " slots but " +
                               environment.launcher + " started " +
                               std::to_string(environment.world_size) + " ranks");
    }
    environment.hosts = std::move(*hosts);
  }
  if (!found->local_rank_known && !environment.hosts.empty()) {
    const auto begin = environment.hosts.begin();
    environment.local_rank =
        static_cast<int>(std::count(begin, begin + environment.rank, *(begin + environment.rank)));
  }
  return resolve_coordinator(get, found, error);
}

}  // namespace

std::optional<std::string> read_text_file(const std::string& path, std::string* error) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) return fail(error, "is a directory");
  std::ifstream file(path, std::ios::binary);
  if (!file) return fail(error, std::string("cannot open (") + std::strerror(errno) + ")");
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return fail(error, "cannot read");
  return text.str();
}

namespace {

std::optional<std::string> read_process_variable(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

}  // namespace

std::optional<launch_environment> detect_launch_environment(const variable_lookup& get,
                                                            const file_reader& read,
                                                            std::string* error) {
  auto found = detect_launcher(get, read, error);
  if (!found) return std::nullopt;
  if (found->environment.launcher == "none") return found->environment;
  if (!complete(get, read, &*found, error)) return std::nullopt;
  return found->environment;
}

std::optional<launch_environment> detect_launch_environment(const variable_lookup& get,
                                                            std::string* error) {
  return detect_launch_environment(get, read_text_file, error);
}

std::optional<launch_environment> detect_launch_environment(std::string* error) {
  return detect_launch_environment(read_process_variable, read_text_file, error);
}

}  // namespace troupe::apps
