// `troupe keys`: the job-file reference printed from the schema, and docs/guide/job-file.md,
// which is generated from it and must not drift from it.

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "tests/support/cli_helpers.h"

namespace {

namespace fs = std::filesystem;

using namespace troupe::testing;

class KeysCliTest : public troupe_command_test {};

/// The lines of `text` that contain `needle`.
std::string lines_with(const std::string& text, const std::string& needle) {
  std::istringstream lines(text);
  std::string line, found;
  while (std::getline(lines, line)) {
    if (line.find(needle) != std::string::npos) found += line + "\n";
  }
  return found;
}

/// "line N: A / B" for the first line where `a` and `b` differ, or "" when they are equal.
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream a_lines(a), b_lines(b);
  std::string a_line, b_line;
  for (int number = 1;; ++number) {
    const bool a_more = static_cast<bool>(std::getline(a_lines, a_line));
    const bool b_more = static_cast<bool>(std::getline(b_lines, b_line));
    if (!a_more && !b_more) return a == b ? "" : "the line ends differ";
    if (a_more != b_more || a_line != b_line) {
      return "line " + std::to_string(number) + ":\n  file:    " + (a_more ? a_line : "(end)") +
             "\n  printed: " + (b_more ? b_line : "(end)");
    }
  }
}

TEST_F(KeysCliTest, TheJobFileGuideIsWhatTroupeKeysPrints) {
  const run_result result = troupe("keys --markdown");
  ASSERT_EQ(result.status, 0) << result.errors;
  const fs::path guide = fs::path(TROUPE_SOURCE_DIR) / "docs/guide/job-file.md";
  const std::string written = read_file(guide);
  EXPECT_EQ(first_difference(written, result.output), "")
      << guide.string() << " disagrees with the job schema; regenerate it from the source "
      << "directory with\n  " << TROUPE_BINARY << " keys --markdown > docs/guide/job-file.md";
}

TEST_F(KeysCliTest, PrintsEveryKeyWithItsDefaultAndMarksExpertKeys) {
  const run_result result = troupe("keys");
  ASSERT_EQ(result.status, 0) << result.errors;
  const std::string& text = result.output;
  EXPECT_NE(text.find("[parallelism]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  stages = 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  layers = [] (required unless the model is a graph, model.nodes)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("model.nodes: a graph instead of model.layers"), std::string::npos) << text;
  EXPECT_NE(text.find("  route = \"chain\"\n"), std::string::npos) << text;
  EXPECT_NE(lines_with(text, "max_active_keys = 0 (the number of stages)"), "") << text;
  EXPECT_NE(lines_with(text, "spin_wait_ms = -1").find("[expert]"), std::string::npos) << text;
  EXPECT_NE(lines_with(text, "threads = 0 (every core)").find("[expert]"), std::string::npos);
  EXPECT_EQ(lines_with(text, "  batch_size = 64").find("[expert]"), std::string::npos);
  EXPECT_NE(text.find("type = \"conv2d\""), std::string::npos) << text;
}

TEST_F(KeysCliTest, PrintsOneSectionAndRefusesAnUnknownOne) {
  const run_result training = troupe("keys training");
  ASSERT_EQ(training.status, 0) << training.errors;
  EXPECT_NE(training.output.find("[training]"), std::string::npos) << training.output;
  EXPECT_EQ(training.output.find("[parallelism]"), std::string::npos) << training.output;
  EXPECT_EQ(training.output.find("type = \"linear\""), std::string::npos) << training.output;
  expect_one_line(troupe("keys trainig"), "unknown section 'trainig'");
}

}  // namespace
