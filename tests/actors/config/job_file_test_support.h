#pragma once

// What the job file's tests share: the smallest valid job, parsing one that must be accepted
// or rejected, and config.json written back as a job file.

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/job_file.h"

namespace troupe::actors::job_file_testing {

/// The smallest valid job: one layer, everything else default.
inline const std::string kMinimal = "[model]\nlayers = [{ type = \"linear\", out = 10 }]\n";

/// One `[[model.nodes]]` table: its name, its blocks (inline tables) and any further keys
/// ("route = \"loop\"\nnext = \"head\"\n").
inline std::string node_table(const std::string& name, const std::string& blocks,
                              const std::string& more = "") {
  return "[[model.nodes]]\nname = \"" + name + "\"\nlayers = [" + blocks + "]\n" + more;
}

/// An Elman RNN language model over text-records: a token embedding 4 wide, a loop cell whose
/// rows are 4 + 8 wide, and a head over the 256 byte tokens.
inline const std::string kRnnJob =
    "[data]\ndataset = \"text-records\"\n" +
    node_table("embed", "{ type = \"embedding\", vocab = 256, dim = 4 }", "next = \"cell\"\n") +
    node_table("cell", "{ type = \"linear\", out = 8 }, { type = \"tanh\" }",
               "route = \"loop\"\nnext = \"head\"\n") +
    node_table("head", "{ type = \"linear\", out = 256 }");

/// A tree classifier over ListOps: an embedding 4 wide, a tree cell whose rows are 4 + 2 × 8
/// wide and that emits the roots, and a head over the 10 classes.
inline const std::string kTreeJob =
    "[data]\ndataset = \"listops\"\n" +
    node_table("embed", "{ type = \"embedding\", vocab = 20, dim = 4 }", "next = \"tree\"\n") +
    node_table("tree", "{ type = \"linear\", out = 8 }, { type = \"tanh\" }",
               "route = \"tree\"\nemit = \"root\"\nnext = \"head\"\n") +
    node_table("head", "{ type = \"linear\", out = 10 }");

inline std::optional<job_config> parse(const std::string& text,
                                       const std::vector<std::string>& overrides = {}) {
  job_error error;
  std::optional<job_config> config = parse_job(text, "job.toml", overrides, &error);
  EXPECT_TRUE(config.has_value()) << error.message;
  return config;
}

/// The message of a job that must be rejected.
inline std::string error_of(const std::string& text,
                            const std::vector<std::string>& overrides = {}) {
  job_error error;
  std::optional<job_config> config = parse_job(text, "job.toml", overrides, &error);
  EXPECT_FALSE(config.has_value()) << text;
  EXPECT_EQ(error.message.find('\n'), std::string::npos) << error.message;
  return error.message;
}

/// Writes JSON back as TOML: one table per section, arrays and inline tables for the values.
inline std::string toml_value(const nlohmann::json& value) {
  if (!value.is_object() && !value.is_array()) return value.dump();
  std::string text = value.is_object() ? "{ " : "[";
  const char* separator = "";
  for (auto it = value.begin(); it != value.end(); ++it, separator = ", ") {
    text += separator;
    if (value.is_object()) text += it.key() + " = ";
    text += toml_value(*it);
  }
  return text + (value.is_object() ? " }" : "]");
}

inline std::string json_to_toml(const nlohmann::json& json) {
  std::string text;
  for (const auto& [section, keys] : json.items()) {
    text += "[" + section + "]\n";
    for (const auto& [key, value] : keys.items()) text += key + " = " + toml_value(value) + "\n";
  }
  return text;
}

}  // namespace troupe::actors::job_file_testing
