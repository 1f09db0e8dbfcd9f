#include "actors/config/job_values.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "actors/config/layer_cuts.h"

namespace troupe::actors::detail {
namespace {

/// The shortest decimal that reads back as `value`, widened: 0.1f gives 0.1, not 0.10000000149.
double widen(float value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::strtod(std::string(buffer, result.ptr).c_str(), nullptr);
}

}  // namespace

field probability_field(const char* name, float* probability) {
  auto read = [probability](const toml::node& node, const std::string& label) -> problem {
    double p = 0;
    if (problem error = read_number(node, label, kBelowOne, &p)) return error;
    *probability = static_cast<float>(p);  // 0.99999999999 would round to 1
    if (*probability >= 1.0f) return label + " must be in [0, 1), got " + format_number(p);
    return std::nullopt;
  };
  return {name, read, [probability] { return nlohmann::json(widen(*probability)); }};
}

namespace {

problem read_device(const toml::node& node, const std::string& label, std::string* out) {
  if (problem error = read_string(node, label, {}, out)) return error;
  const std::string& name = *out;
  const bool numbered =
      name.size() > 5 && name.size() <= 8 && name.rfind("cuda:", 0) == 0 &&
      std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (name == "cpu" || name == "cuda" || numbered) return std::nullopt;
  return label + " must be \"cpu\", \"cuda\" or \"cuda:N\", got '" + name + "'";
}

}  // namespace

problem read_devices(const toml::node& node, const std::string& label,
                     std::vector<std::string>* out) {
  if (!node.is_string()) {
    return read_array(node, label, "a device name or an array of them", read_device, out);
  }
  std::string device;
  if (problem error = read_device(node, label, &device)) return error;
  return *out = {device}, std::nullopt;
}

namespace {

/// One cut point of an array: a block index, or "block:row" for a cut inside a linear layer.
problem read_cut(const toml::node& node, const std::string& label, std::string* out) {
  const std::optional<std::string> text = node.value_exact<std::string>();
  std::vector<cut_point> cut;
  if (text && parse_cut_points(*text, &cut) && cut.size() == 1) {
    return *out = cut_points_text(cut), std::nullopt;
  }
  int64_t block = 0;
  if (!node.is_integer()) {
    return label + " must be a block index such as 3, or \"3:512\" to cut inside a linear layer" +
           (text ? ", got '" + *text + "'" : "");
  }
  if (problem error = read_positive(node, label, &block)) return error;
  return *out = std::to_string(block), std::nullopt;
}

}  // namespace

problem read_partition(const toml::node& node, const std::string& label, std::string* out) {
  const std::string expected =
      "\"balanced\", \"measured\", \"uniform\" or an array of cut points such as [3, 7] or "
      "[\"4:784\"] (block 4 from its output 784 on)";
  const std::optional<std::string> text = node.value_exact<std::string>();
  if (node.is_array()) {
    std::vector<std::string> cuts;
    if (problem error = read_array(node, label, expected, read_cut, &cuts)) return error;
    std::string joined;
    for (const std::string& cut : cuts) joined += (joined.empty() ? "" : ",") + cut;
    return *out = joined, std::nullopt;
  }
  if (!text) return wrong_type(label, expected, node);
  std::vector<cut_point> cuts;
  if (*text == "balanced" || *text == "measured" || *text == "uniform") {
    return *out = *text, std::nullopt;
  }
  if (!parse_cut_points(*text, &cuts)) {
    return label + " must be " + expected + ", got '" + *text + "'";
  }
  return *out = cut_points_text(cuts), std::nullopt;
}

nlohmann::json partition_json(const std::string& partition) {
  std::vector<cut_point> cuts;
  if (!parse_cut_points(partition, &cuts)) return partition;
  nlohmann::json json = nlohmann::json::array();
  for (const cut_point& cut : cuts) {
    if (cut.row > 0) {
      json.push_back(cut_points_text({cut}));
    } else {
      json.push_back(cut.block);
    }
  }
  return json;
}

}  // namespace troupe::actors::detail
