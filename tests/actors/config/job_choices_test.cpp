// The keys whose values are a closed set: read once from their names into enums, written back
// by the same names (config.json and its hashes spell them as the job file does).

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/config/job_config.h"
#include "actors/config/job_file.h"
#include "tests/actors/config/job_file_test_support.h"

namespace troupe::actors {
namespace {

using namespace job_file_testing;

/// Each name of E, set as `section.key` (after `extra` for that name), reads into its value,
/// and to_json() writes the name back.
template <typename E, typename Get, typename Extra>
void expect_names_read_and_written(const std::string& section, const std::string& key, Get get,
                                   Extra extra) {
  for (const named_choice<E>& choice : choice_names<E>()) {
    std::vector<std::string> overrides = extra(std::string(choice.name));
    overrides.push_back(section + "." + key + "=\"" + choice.name + "\"");
    const std::optional<job_config> config = parse(kMinimal, overrides);
    ASSERT_TRUE(config.has_value()) << choice.name;
    EXPECT_TRUE(get(*config) == choice.value) << choice.name;
    EXPECT_EQ(to_json(*config)[section][key], choice.name);
  }
}

auto nothing_more = [](const std::string&) { return std::vector<std::string>{}; };

TEST(JobChoicesTest, EveryNameReadsIntoItsValueAndIsWrittenBack) {
  expect_names_read_and_written<dataset_kind>(
      "data", "dataset", [](const job_config& c) { return c.data.dataset; }, nothing_more);
  expect_names_read_and_written<pipeline_mode>(
      "parallelism", "mode", [](const job_config& c) { return c.parallelism.mode; }, nothing_more);
  expect_names_read_and_written<pipeline_schedule>(
      "parallelism", "schedule", [](const job_config& c) { return c.parallelism.schedule; },
      nothing_more);
  expect_names_read_and_written<staleness_correction_kind>(
      "parallelism", "staleness_correction",
      [](const job_config& c) { return c.parallelism.staleness_correction; },
      [](const std::string&) { return std::vector<std::string>{"training.momentum=0.9"}; });
  // NCCL sums CUDA stages, shared memory CPU ones.
  expect_names_read_and_written<collective_kind>(
      "parallelism", "collective", [](const job_config& c) { return c.parallelism.collective; },
      [](const std::string& name) {
        return std::vector<std::string>{name == "nccl" ? "parallelism.devices=\"cuda:0\""
                                                       : "parallelism.devices=\"cpu\""};
      });
  expect_names_read_and_written<layers::optimizer_kind>(
      "training", "optimizer", [](const job_config& c) { return c.training.optimizer; },
      nothing_more);
  expect_names_read_and_written<lr_schedule_kind>(
      "training", "lr_schedule", [](const job_config& c) { return c.training.lr_schedule; },
      [](const std::string&) { return std::vector<std::string>{"training.lr_decay_epochs=1"}; });
  expect_names_read_and_written<layers::math_precision>(
      "training", "precision", [](const job_config& c) { return c.training.precision; },
      nothing_more);
}

TEST(JobChoicesTest, MessagesNameEachValueAsTheJobFileDoes) {
  EXPECT_STREQ(to_string(pipeline_schedule::one_f_one_b), "1f1b");
  EXPECT_STREQ(to_string(pipeline_schedule::zb_h1), "zb-h1");
  EXPECT_STREQ(to_string(staleness_correction_kind::two_bw), "2bw");
  EXPECT_STREQ(to_string(dataset_kind::fashion_mnist), "fashion-mnist");
  nlohmann::json json = {{"mode", pipeline_mode::async}, {"collective", collective_kind::nccl}};
  EXPECT_EQ(json.dump(), R"({"collective":"nccl","mode":"async"})");
}

}  // namespace
}  // namespace troupe::actors
