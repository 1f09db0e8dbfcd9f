#pragma once

// What the job file's tests share: the smallest valid job, and parsing one that must be
// accepted or rejected.

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_file.h"

namespace troupe::actors::job_file_testing {

/// The smallest valid job: one layer, everything else default.
inline const std::string kMinimal = "[model]\nlayers = [{ type = \"linear\", out = 10 }]\n";

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

}  // namespace troupe::actors::job_file_testing
