#include "apps/launch_environment.h"

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

/// Expansions beyond this many names are refused, so that a typo cannot exhaust memory.
constexpr int64_t max_names = int64_t{1} << 20;

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

/// `text` as a decimal number in [min, max]; nothing on any other character.
std::optional<int64_t> parse_number(std::string_view text, int64_t min, int64_t max) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value < min || value > max) return std::nullopt;
  return value;
}

/// `text` cut at every `separator`, empty pieces kept.
std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> pieces(1);
  for (const char c : text) {
    if (c == separator) {
      pieces.emplace_back();
    } else {
      pieces.back() += c;
    }
  }
  return pieces;
}

std::string padded(int64_t value, size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

/// The names of a hostlist with brackets left unexpanded, cut at commas and whitespace that
/// are outside brackets.
std::optional<host_names> split_hostlist(const std::string& list, std::string* error) {
  const std::string where = "hostlist '" + list + "'";
  std::vector<std::string> names;
  std::string name;
  bool in_brackets = false;
  for (const char c : list) {
    if (c == '[' && in_brackets) return fail(error, where + " nests '['");
    if (c == ']' && !in_brackets) return fail(error, where + " has ']' without '['");
    if (c == '[' || c == ']') in_brackets = (c == '[');
    if (!in_brackets && (c == ',' || std::isspace(static_cast<unsigned char>(c)))) {
      if (!name.empty()) names.push_back(name);
      name.clear();
    } else {
      name += c;
    }
  }
  if (in_brackets) return fail(error, where + " does not close its last '['");
  if (!name.empty()) names.push_back(name);
  if (names.empty()) return fail(error, where + " names no hosts");
  return names;
}

/// The numbers that the inside of one bracket group ("01-04,07") stands for, each as wide as
/// its range's first bound.
std::optional<host_names> expand_ranges(const std::string& ranges, const std::string& list,
                                        std::string* error) {
  const std::string where = " in hostlist '" + list + "'";
  if (ranges.empty()) return fail(error, "empty brackets '[]'" + where);
  std::vector<std::string> numbers;
  for (const std::string& range : split(ranges, ',')) {
    const size_t dash = range.find('-');
    const std::string low_text = range.substr(0, dash);
    const std::string high_text = dash == std::string::npos ? low_text : range.substr(dash + 1);
    const auto low = parse_number(low_text, 0, INT_MAX);
    const auto high = parse_number(high_text, 0, INT_MAX);
    if (!low || !high) {
      return fail(error, "range '" + range + "'" + where + " is not N or N-M with digits");
    }
    if (*low > *high) return fail(error, "range '" + range + "'" + where + " is descending");
    if (*high - *low + static_cast<int64_t>(numbers.size()) >= max_names) {
      return fail(error, "range '" + range + "'" + where + " names too many hosts");
    }
    for (int64_t value = *low; value <= *high; ++value) {
      numbers.push_back(padded(value, low_text.size()));
    }
  }
  return numbers;
}

/// One name of a hostlist with its bracket groups expanded, leftmost group slowest.
std::optional<host_names> expand_name(const std::string& name, const std::string& list,
                                      std::string* error) {
  std::vector<std::string> names = {""};
  size_t position = 0;
  while (true) {
    const size_t open = name.find('[', position);
    for (std::string& prefix : names) prefix += name.substr(position, open - position);
    if (open == std::string::npos) return names;
    const size_t close = name.find(']', open);  // split_hostlist checked that it exists
    const auto numbers = expand_ranges(name.substr(open + 1, close - open - 1), list, error);
    if (!numbers) return std::nullopt;
    if (static_cast<int64_t>(names.size() * numbers->size()) > max_names) {
      return fail(error, "'" + name + "' in hostlist '" + list + "' names too many hosts");
    }
    std::vector<std::string> product;
    product.reserve(names.size() * numbers->size());
    for (const std::string& prefix : names) {
      for (const std::string& number : *numbers) product.push_back(prefix + number);
    }
    names = std::move(product);
    position = close + 1;
  }
}

/// One hostfile line: the host and its slot count, or an empty host for a blank line.
struct hostfile_line {
  std::string host;
  int64_t slots = 0;
};

/// Takes the MPICH "host:N" form apart; a host with several colons is an IPv6 address.
bool take_colon_slots(hostfile_line* line, std::optional<int64_t>* slots, const std::string& where,
                      std::string* error) {
  if (std::count(line->host.begin(), line->host.end(), ':') != 1) return true;
  const size_t colon = line->host.find(':');
  const std::string count = line->host.substr(colon + 1);
  *slots = parse_number(count, 1, max_names);
  line->host.resize(colon);
  if (line->host.empty()) return report(error, where + "no host name before ':'");
  if (!*slots) {
    return report(error, where + "slot count '" + count + "' is not a positive integer");
  }
  return true;
}

std::optional<hostfile_line> parse_hostfile_line(const std::string& text, const std::string& where,
                                                 std::string* error) {
  std::istringstream fields(text.substr(0, text.find('#')));
  hostfile_line line;
  if (!(fields >> line.host)) return line;
  std::optional<int64_t> slots;
  if (!take_colon_slots(&line, &slots, where, error)) return std::nullopt;
  std::string field;
  while (fields >> field) {
    if (field.rfind("max_slots=", 0) == 0) continue;  // a cap for oversubscription; unused
    if (field.rfind("slots=", 0) != 0) {
      return fail(error, where + "unknown field '" + field + "' (expected slots=N)");
    }
    if (slots) return fail(error, where + "slots given twice");
    const std::string count = field.substr(6);
    slots = parse_number(count, 1, max_names);
    if (!slots) return fail(error, where + "slots value '" + count + "' is not a positive integer");
  }
  line.slots = slots.value_or(1);
  return line;
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
  const auto value = parse_number(variable.value, min, INT_MAX);
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
  const auto port = parse_number(port_text, 1, 65535);
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

std::optional<host_names> expand_hostlist(const std::string& list, std::string* error) {
  const auto names = split_hostlist(list, error);
  if (!names) return std::nullopt;
  std::vector<std::string> hosts;
  for (const std::string& name : *names) {
    const auto expanded = expand_name(name, list, error);
    if (!expanded) return std::nullopt;
    if (static_cast<int64_t>(hosts.size() + expanded->size()) > max_names) {
      return fail(error, "hostlist '" + list + "' names too many hosts");
    }
    hosts.insert(hosts.end(), expanded->begin(), expanded->end());
  }
  return hosts;
}

std::optional<std::vector<int>> expand_tasks_per_node(const std::string& text, std::string* error) {
  std::vector<int> counts;
  for (const std::string& entry : split(text, ',')) {
    const size_t open = entry.find("(x");
    std::optional<int64_t> repeat = 1;
    if (open != std::string::npos) {
      const bool closed = entry.back() == ')';
      repeat = closed ? parse_number(entry.substr(open + 2, entry.size() - open - 3), 1, max_names)
                      : std::nullopt;
    }
    const auto count = parse_number(entry.substr(0, open), 1, INT_MAX);
    if (!count || !repeat || static_cast<int64_t>(counts.size()) + *repeat > max_names) {
      return fail(error, "'" + entry + "' in tasks per node '" + text +
                             "' is not N or N(xM) with positive N and M");
    }
    counts.insert(counts.end(), *repeat, static_cast<int>(*count));
  }
  return counts;
}

std::optional<host_names> read_hostfile(const std::string& text, const std::string& source_name,
                                        std::string* error) {
  std::vector<std::string> hosts;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    const std::string where = source_name + ":" + std::to_string(number) + ": ";
    const auto parsed = parse_hostfile_line(line, where, error);
    if (!parsed) return std::nullopt;
    if (static_cast<int64_t>(hosts.size()) + parsed->slots > max_names) {
      return fail(error, where + "more than " + std::to_string(max_names) + " slots in all");
    }
    hosts.insert(hosts.end(), parsed->slots, parsed->host);
  }
  if (hosts.empty()) return fail(error, source_name + " lists no hosts");
  return hosts;
}

}  // namespace troupe::apps
