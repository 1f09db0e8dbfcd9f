#pragma once

// `--sweep KEY=V1,V2,...`, as `troupe simulate` and `troupe converge` take it.

#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace troupe::apps {

struct sweep_option {
  std::string key;
  std::vector<std::string> values;  ///< each in TOML syntax, as after --set KEY=
};

/// The key and values of `text`; nothing, with `error` naming the option, when it is not
/// KEY=V1,V2,...
inline std::optional<sweep_option> parse_sweep(const std::string& text, std::string* error) {
  const size_t equals = text.find('=');
  if (equals == std::string::npos || equals == 0 || equals + 1 == text.size()) {
    *error = "--sweep " + text + ": expected KEY=V1,V2,...";
    return std::nullopt;
  }
  sweep_option sweep{text.substr(0, equals), {}};
  std::stringstream values(text.substr(equals + 1));
  for (std::string value; std::getline(values, value, ',');) sweep.values.push_back(value);
  return sweep;
}

}  // namespace troupe::apps
