#include "actors/config/json_text.h"

namespace troupe::actors {

std::string json_limits_problem(std::string_view text, const json_limits& limits) {
  if (text.size() > limits.max_bytes) {
    return std::to_string(text.size()) + " bytes, more than the " +
           std::to_string(limits.max_bytes) + " a JSON text may hold";
  }
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limits.max_depth) {
        return "nested deeper than " + std::to_string(limits.max_depth) + " levels (at byte " +
               std::to_string(i) + ")";
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return "";
}

std::optional<nlohmann::json> parse_json_text(std::string_view text, std::string* error,
                                              const json_limits& limits) {
  const std::string problem = json_limits_problem(text, limits);
  if (!problem.empty()) {
    *error = problem;
    return std::nullopt;
  }
  nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    *error = "not valid JSON";
    return std::nullopt;
  }
  return value;
}

}  // namespace troupe::actors
