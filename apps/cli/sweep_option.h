#pragma once

// `--sweep KEY=V1,V2,...` and `--setting NAME:KEY=VALUE[,KEY=VALUE...]`, as `troupe simulate` and
// `troupe converge` take them: each names a variant of the job by its job-file overrides.

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

/// A named list of job-file overrides.
struct setting {
  std::string name;
  std::vector<std::string> overrides;
  std::string swept;  ///< the --sweep value it stands for ("" for a --setting's)
};

/// "NAME:KEY=VALUE,KEY=VALUE" (a --setting), or nothing with `error` set.
inline std::optional<setting> parse_setting(const std::string& text, std::string* error) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    *error = "--setting " + text + ": expected NAME:KEY=VALUE[,KEY=VALUE...]";
    return std::nullopt;
  }
  setting result{text.substr(0, colon), {}, ""};
  std::stringstream overrides(text.substr(colon + 1));
  for (std::string item; std::getline(overrides, item, ',');) {
    if (item.find('=') == std::string::npos) {
      *error = "--setting " + text + ": '" + item + "' is not KEY=VALUE";
      return std::nullopt;
    }
    result.overrides.push_back(item);
  }
  return result;
}

/// The settings of every --setting in `settings`, then one per value of `sweep` (parsed, or
/// none), named by the value without a TOML string's quotes; nothing, with `error` naming the
/// option, when a --setting does not parse. Empty when there are neither.
inline std::optional<std::vector<setting>> parse_settings(const std::vector<std::string>& settings,
                                                          const std::optional<sweep_option>& sweep,
                                                          std::string* error) {
  std::vector<setting> result;
  for (const std::string& text : settings) {
    auto parsed = parse_setting(text, error);
    if (!parsed) return std::nullopt;
    result.push_back(*parsed);
  }
  if (sweep) {
    for (const std::string& value : sweep->values) {
      std::string name = value;
      if (name.size() >= 2 && name.front() == '"' && name.back() == '"') {
        name = name.substr(1, name.size() - 2);
      }
      result.push_back({name, {sweep->key + "=" + value}, value});
    }
  }
  return result;
}

}  // namespace troupe::apps
