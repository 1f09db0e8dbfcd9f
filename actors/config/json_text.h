#pragma once

// JSON that troupe reads from a file or a peer (a checkpoint manifest, a safetensors header, a
// profile, a run's config.json or metrics, a control message) passes these bounds before it is
// parsed. The parser itself is iterative, but copying, printing and comparing a value recurse
// once per level: a manifest of a million nested brackets would overflow the stack of whatever
// touched it next. No file troupe writes nests deeper than a few levels.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace troupe::actors {

struct json_limits {
  size_t max_depth = 64;                 ///< arrays and objects inside one another
  size_t max_bytes = 256 * 1024 * 1024;  ///< the whole text
};

/// "" when `text` keeps within `limits`; otherwise why not ("nested deeper than 64 levels",
/// "N bytes, more than the M a JSON text may hold"). Strings are skipped, escapes included,
/// so brackets inside them do not count. It does not check that the text is JSON.
std::string json_limits_problem(std::string_view text, const json_limits& limits = {});

/// `text` parsed; nothing, with `error` set ("not valid JSON" or json_limits_problem()'s
/// reason), when it is out of bounds or not JSON.
std::optional<nlohmann::json> parse_json_text(std::string_view text, std::string* error,
                                              const json_limits& limits = {});

}  // namespace troupe::actors
