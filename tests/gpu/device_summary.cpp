// troupe_device_summary WORK OUT BUNDLE: gathers what tests/gpu/device_check.sh left in WORK
// (steps.tsv, the benchmarks' JSON, PyTorch's lines) and OUT (nvidia-smi, the gtest XML,
// compute-sanitizer's log) into OUT/summary.json, with every figure, the ratios against
// PyTorch and cuBLAS, and each of the GPU bars as met, missed or not measured; prints a
// short table. Exit status 0 when it wrote the summary, 1 when it could not.

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

using json = nlohmann::json;

const char* const precisions[] = {"fp32", "tf32", "bf16"};

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

/// A JSON file, or null when it is missing or malformed.
json read_json(const std::string& path) {
  std::ifstream file(path);
  if (!file) return nullptr;
  json value = json::parse(file, nullptr, false);
  return value.is_discarded() ? json(nullptr) : value;
}

/// The first capture of `pattern` in `text`, if any.
std::optional<std::string> find(const std::string& text, const std::string& pattern) {
  std::smatch match;
  if (!std::regex_search(text, match, std::regex(pattern))) return std::nullopt;
  return match[1].str();
}

std::vector<std::string> split(const std::string& line, char separator) {
  std::vector<std::string> fields;
  std::stringstream stream(line);
  for (std::string field; std::getline(stream, field, separator);) fields.push_back(field);
  return fields;
}

/// device_check.sh's steps, one `name TAB status TAB seconds TAB detail` line each.
json read_steps(const std::string& path) {
  json steps = json::array();
  std::ifstream file(path);
  for (std::string line; std::getline(file, line);) {
    const auto fields = split(line, '\t');
    if (fields.size() < 3) continue;
    steps.push_back({{"name", fields[0]},
                     {"status", fields[1]},
                     {"seconds", std::atof(fields[2].c_str())},
                     {"detail", fields.size() > 3 ? fields[3] : ""}});
  }
  return steps;
}

json gpu_of(const std::string& nvidia_smi) {
  const auto name = find(nvidia_smi, R"(Product Name\s*:\s*([^\n]+))");
  const auto driver = find(nvidia_smi, R"(Driver Version\s*:\s*([^\n]+))");
  const auto cuda = find(nvidia_smi, R"(CUDA Version\s*:\s*([^\n]+))");
  return {{"present", name.has_value()},
          {"name", name ? json(*name) : json(nullptr)},
          {"driver", driver ? json(*driver) : json(nullptr)},
          {"cuda", cuda ? json(*cuda) : json(nullptr)}};
}

/// Test counts of a gtest XML report (null when there is none).
json tests_of(const std::string& path) {
  const std::string xml = read_text(path);
  if (xml.empty()) return nullptr;
  auto count = [&](const std::string& pattern) {
    const std::regex expression(pattern);
    return std::distance(std::sregex_iterator(xml.begin(), xml.end(), expression),
                         std::sregex_iterator());
  };
  return {{"tests", count("<testcase ")},
          {"failures", count("<failure ")},
          {"skipped", count("<skipped ")}};
}

/// Every layer GEMM of one `troupe bench compute --json` at one precision.
json gemms_of(const json& compute) {
  json rows = json::array();
  if (!compute.is_object()) return rows;
  for (const json& layer : compute.value("layers", json::array())) {
    for (const char* gemm : {"forward", "weight_gradient", "input_gradient"}) {
      const std::string key = gemm;
      if (!layer.contains(key + "_gflops")) continue;
      json row = {{"layer", layer.value("layer", "")},
                  {"batch", layer.value("batch", 0)},
                  {"gemm", key},
                  {"troupe_tflops", layer[key + "_gflops"].get<double>() / 1e3}};
      if (layer.contains(key + "_cublas_best_gflops")) {
        row["cublas_best_tflops"] = layer[key + "_cublas_best_gflops"].get<double>() / 1e3;
        row["fraction_of_cublas_best"] = layer[key + "_fraction_of_cublas_best"];
      }
      rows.push_back(row);
    }
  }
  return rows;
}

/// troupe's end-to-end samples/s at one precision against PyTorch's runs before and after it.
json end_to_end_of(const json& compute, const std::string& pytorch_lines) {
  json result = {{"troupe_samples_per_s", nullptr}, {"pytorch_samples_per_s", json::array()}};
  if (compute.is_object() && compute.contains("pytorch_comparison"))
    result["troupe_samples_per_s"] = compute["pytorch_comparison"]["samples_per_s"];
  const std::regex line(R"(pytorch_mlp .*samples_per_s=([0-9.]+))");
  for (std::sregex_iterator it(pytorch_lines.begin(), pytorch_lines.end(), line), end; it != end;
       ++it)
    result["pytorch_samples_per_s"].push_back(std::atof((*it)[1].str().c_str()));
  const json& runs = result["pytorch_samples_per_s"];
  if (result["troupe_samples_per_s"].is_number() && !runs.empty()) {
    // Against PyTorch's faster run: the ratio errs on PyTorch's side.
    const double best = *std::max_element(runs.begin(), runs.end());
    result["ratio_to_pytorch"] = result["troupe_samples_per_s"].get<double>() / best;
  }
  return result;
}

/// The GPT example against PyTorch on the GPU: apps/bench/pytorch_gpt.py's `compare` output
/// (per-step losses) and `speed` table (tokens/s of each configuration and its ratio).
json gpt_of(const std::string& compare, const std::string& speed) {
  json result = {{"loss_worst_relative_difference", nullptr},
                 {"loss_tolerance", nullptr},
                 {"tokens_per_s", json::object()},
                 {"ratio_to_pytorch", json::object()}};
  const auto worst = find(compare, R"(worst relative difference ([0-9.eE+-]+))");
  if (worst) result["loss_worst_relative_difference"] = std::atof(worst->c_str());
  const auto tolerance = find(compare, R"(\(tolerance ([0-9.eE+-]+)\))");
  if (tolerance) result["loss_tolerance"] = std::atof(tolerance->c_str());
  const std::regex row(R"(^(pytorch|troupe .*?)\s+([0-9]+)\s+([0-9.]+)\s*$)");
  std::stringstream lines(speed);
  for (std::string line; std::getline(lines, line);) {
    std::smatch match;
    if (!std::regex_match(line, match, row)) continue;
    result["tokens_per_s"][match[1].str()] = std::atof(match[2].str().c_str());
    result["ratio_to_pytorch"][match[1].str()] = std::atof(match[3].str().c_str());
  }
  return result;
}

enum class direction { at_least, at_most };

json bar(const std::string& name, std::optional<double> value, double threshold,
         const std::string& unit, direction needed = direction::at_least) {
  std::string status = "not measured";
  if (value)
    status = (needed == direction::at_least ? *value >= threshold : *value <= threshold) ? "met"
                                                                                         : "missed";
  return {{"bar", name},
          {"status", status},
          {"value", value ? json(*value) : json(nullptr)},
          {"threshold", threshold},
          {"needs", needed == direction::at_least ? ">=" : "<="},
          {"unit", unit}};
}

json bars_of(const json& summary) {
  json bars = json::array();
  std::optional<double> tests_passing;
  const json& tests = summary["tests"];
  if (summary["gpu"]["present"].get<bool>() && tests["layers"].is_object() &&
      tests["actors"].is_object())
    tests_passing =
        tests["layers"]["failures"].get<double>() + tests["actors"]["failures"].get<double>() == 0
            ? 1.0
            : 0.0;
  bars.push_back(
      bar("GPU tests pass (parity, exactness, precision)", tests_passing, 1, "all pass"));
  std::optional<double> clean;
  if (summary["memcheck"]["errors"].is_number())
    clean = summary["memcheck"]["errors"].get<double>() == 0 ? 1.0 : 0.0;
  bars.push_back(bar("compute-sanitizer memcheck clean", clean, 1, "no errors"));
  std::optional<double> worst_gemm;
  for (const char* precision : precisions)
    for (const json& row : summary["gemm"][precision])
      if (row.contains("fraction_of_cublas_best"))
        worst_gemm =
            std::min(worst_gemm.value_or(1e9), row["fraction_of_cublas_best"].get<double>());
  bars.push_back(bar("every layer GEMM vs cuBLAS's best", worst_gemm, 0.9, "fraction"));
  for (const char* precision : precisions) {
    const json& e2e = summary["end_to_end"][precision];
    std::optional<double> ratio;
    if (e2e.contains("ratio_to_pytorch")) ratio = e2e["ratio_to_pytorch"].get<double>();
    bars.push_back(
        bar(std::string("end-to-end MLP vs PyTorch eager, ") + precision, ratio, 1.0, "ratio"));
  }
  std::optional<double> four;
  if (summary["pipeline"].contains("four_stages_over_one_stage"))
    four = summary["pipeline"]["four_stages_over_one_stage"].get<double>();
  bars.push_back(bar("4 stages on one GPU vs one stage", four, 0.95, "ratio"));
  const json& gpt = summary["gpt"];
  std::optional<double> loss_difference;
  if (gpt["loss_worst_relative_difference"].is_number())
    loss_difference = gpt["loss_worst_relative_difference"].get<double>();
  bars.push_back(bar("GPT per-step losses vs PyTorch, fp32", loss_difference,
                     gpt["loss_tolerance"].is_number() ? gpt["loss_tolerance"].get<double>() : 1e-4,
                     "relative difference", direction::at_most));
  std::optional<double> gpt_ratio;
  if (gpt["ratio_to_pytorch"].contains("troupe 1 stage"))
    gpt_ratio = gpt["ratio_to_pytorch"]["troupe 1 stage"].get<double>();
  bars.push_back(bar("GPT tokens/s vs PyTorch eager, fp32", gpt_ratio, 1.0, "ratio"));
  return bars;
}

void print_table(const json& summary) {
  std::printf("device check on %s\n", summary["gpu"]["present"].get<bool>()
                                          ? summary["gpu"]["name"].get<std::string>().c_str()
                                          : "a machine without a GPU");
  for (const json& step : summary["steps"])
    std::printf("  %-20s %-8s %7.1f s  %s\n", step["name"].get<std::string>().c_str(),
                step["status"].get<std::string>().c_str(), step["seconds"].get<double>(),
                step["detail"].get<std::string>().c_str());
  for (const json& b : summary["bars"]) {
    char value[32] = "-";
    if (b["value"].is_number())
      std::snprintf(value, sizeof value, "%.4g", b["value"].get<double>());
    std::printf("  bar: %-48s %-12s %s (needs %s %g)\n", b["bar"].get<std::string>().c_str(),
                b["status"].get<std::string>().c_str(), value,
                b["needs"].get<std::string>().c_str(), b["threshold"].get<double>());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: troupe_device_summary WORK OUT BUNDLE\n");
    return 2;
  }
  const std::string work = argv[1], out = argv[2], bundle = argv[3];
  json summary;
  summary["bundle"] = read_json(bundle + "/manifest.json");
  summary["gpu"] = gpu_of(read_text(out + "/nvidia-smi.txt"));
  summary["steps"] = read_steps(work + "/steps.tsv");
  summary["tests"] = {{"layers", tests_of(out + "/gpu-tests-layers.xml")},
                      {"actors", tests_of(out + "/gpu-tests-actors.xml")}};
  const auto errors = find(read_text(out + "/memcheck.txt"), R"(ERROR SUMMARY: (\d+) error)");
  summary["memcheck"] = {{"errors", errors ? json(std::stoi(*errors)) : json(nullptr)}};
  for (const char* precision : precisions) {
    const json compute = read_json(work + "/compute-" + precision + ".json");
    summary["gemm"][precision] = gemms_of(compute);
    summary["end_to_end"][precision] =
        end_to_end_of(compute, read_text(work + "/pytorch-" + precision + ".txt"));
  }
  const json pipeline = read_json(work + "/pipeline.json");
  summary["pipeline"] = pipeline.is_object() ? pipeline : json::object();
  summary["gpt"] = gpt_of(read_text(work + "/gpt-compare.txt"), read_text(work + "/gpt-speed.txt"));
  summary["bars"] = bars_of(summary);
  int failed = 0, skipped = 0;
  for (const json& step : summary["steps"]) {
    failed += step["status"] == "failed";
    skipped += step["status"] == "skipped";
  }
  summary["failed_steps"] = failed;
  summary["skipped_steps"] = skipped;
  std::ofstream file(out + "/summary.json");
  file << summary.dump(2) << "\n";
  if (!file) {
    std::fprintf(stderr, "troupe_device_summary: cannot write %s/summary.json\n", out.c_str());
    return 1;
  }
  print_table(summary);
  return 0;
}
