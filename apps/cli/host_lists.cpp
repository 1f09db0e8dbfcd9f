#include "apps/cli/host_lists.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <sstream>

namespace troupe::apps {
namespace {

/// Expansions beyond this many names are refused, so that a typo cannot exhaust memory.
constexpr int64_t max_names = int64_t{1} << 20;

/// Sets `error` (when not null) to `message`; nothing.
std::nullopt_t fail(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return std::nullopt;
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
    const auto low = parse_decimal(low_text, 0, INT_MAX);
    const auto high = parse_decimal(high_text, 0, INT_MAX);
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
  *slots = parse_decimal(count, 1, max_names);
  line->host.resize(colon);
  if (line->host.empty()) {
    fail(error, where + "no host name before ':'");
    return false;
  }
  if (!*slots) {
    fail(error, where + "slot count '" + count + "' is not a positive integer");
    return false;
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
    slots = parse_decimal(count, 1, max_names);
    if (!slots) return fail(error, where + "slots value '" + count + "' is not a positive integer");
  }
  line.slots = slots.value_or(1);
  return line;
}

}  // namespace

std::optional<int64_t> parse_decimal(std::string_view text, int64_t min, int64_t max) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  int64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value < min || value > max) return std::nullopt;
  return value;
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
      repeat = closed ? parse_decimal(entry.substr(open + 2, entry.size() - open - 3), 1, max_names)
                      : std::nullopt;
    }
    const auto count = parse_decimal(entry.substr(0, open), 1, INT_MAX);
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
