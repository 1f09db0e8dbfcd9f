#pragma once

// The host lists that launchers hand their ranks: Slurm's compressed hostlists and
// tasks-per-node counts, and Open MPI / MPICH hostfiles. Pure text parsing; a bad list is one
// line naming the list and the part at fault.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::apps {

/// Host names or addresses, in order.
using host_names = std::vector<std::string>;

/// `text` as a decimal number in [min, max]; nothing on any other character.
std::optional<int64_t> parse_decimal(std::string_view text, int64_t min, int64_t max);

/// Expands a Slurm hostlist: "n[01-04,07],gpu7,r[1-2]-n[1-2]" gives n01 n02 n03 n04 n07 gpu7
/// r1-n1 r1-n2 r2-n1 r2-n2. Names are separated by commas or whitespace; each bracket group
/// lists numbers and ranges, printed as wide as the range's first bound ("01-4" gives 01..04,
/// as Slurm does); several groups expand leftmost-slowest. On a malformed list (empty or
/// unclosed brackets, descending ranges, non-digits, more than 2^20 names) returns nothing
/// and sets `error` naming the list and the part at fault.
std::optional<host_names> expand_hostlist(const std::string& list, std::string* error);

/// Expands Slurm's tasks-per-node form "2(x3),1" into one count per node: {2, 2, 2, 1}.
/// Counts must be positive. On malformed text returns nothing and sets `error`.
std::optional<std::vector<int>> expand_tasks_per_node(const std::string& text, std::string* error);

/// Parses the text of a hostfile: one host per line as "host", "host slots=N" (Open MPI;
/// max_slots=M is accepted and ignored) or "host:N" (MPICH; a name with several colons is an
/// IPv6 address), '#' starting a comment, blank lines skipped; `source_name` is for messages.
/// Returns one entry per slot, in file order ("a slots=2\nb" gives a a b). On a bad line
/// returns nothing with `error` as "source_name:line: problem", e.g. a slots value that is not
/// a positive integer.
std::optional<host_names> read_hostfile(const std::string& text, const std::string& source_name,
                                        std::string* error);

}  // namespace troupe::apps
