// The stand-in pipeline of stage processes that calibrate runs to measure time-slicing, and
// what calibration measures for a replicated job.

#include "sim/calibration/process_pipeline.h"

#include <gtest/gtest.h>

#include <thread>

#include "sim/calibration/calibrate.h"
#include "sim/profile.h"
#include "tests/sim/simulation_fixtures.h"

namespace troupe::sim {
namespace {

TEST(ProcessPipelineTest, KeysGoNoFasterThanTheirStagesSpin) {
  std::string error;
  // One stage, one key: each key spins 2 ms of CPU time there, so at most 500 keys per second.
  auto alone = process_pipeline_keys_per_s({{2e-3, 0, 1024}}, 1024, 4, 1, false, 0, 0.2, &error);
  ASSERT_TRUE(alone) << error;
  EXPECT_LT(*alone, 500 * 1.02);
  EXPECT_GT(*alone, 50);
  // Three stages and one key: forward through all three (1 ms each, the last stage's visit
  // being its forward and backward), back through the first two (1 ms each): 5 ms per key.
  const std::vector<pipeline_stage_cost> chain = {
      {1e-3, 1e-3, 4096}, {1e-3, 1e-3, 4096}, {1e-3, 0, 4096}};
  auto one_key = process_pipeline_keys_per_s(chain, 4096, 4, 1, false, 0, 0.2, &error);
  ASSERT_TRUE(one_key) << error;
  EXPECT_LT(*one_key, 200 * 1.02);
  EXPECT_GT(*one_key, 20);
  std::printf("one stage: %.0f keys/s (at most 500); three stages: %.0f keys/s (at most 200)\n",
              *alone, *one_key);
}

TEST(ProcessPipelineTest, AFlushAdmitsTheNextKeysOnlyOnceAllAreDone) {
  // Two stages of 10 ms (the first's forward, the last's visit) and two keys. Flushed, a step
  // is 30 ms: stage 0 forwards key 1, then key 2 while stage 1 takes key 1, then stage 1 takes
  // key 2: at most 66.7 keys/s. Without the flush the stages overlap, 10 ms per key on two
  // idle cores (not asserted: another test may hold a core).
  const std::vector<pipeline_stage_cost> stages = {{10e-3, 0, 4096}, {10e-3, 0, 4096}};
  std::string error;
  auto flushed = process_pipeline_keys_per_s(stages, 4096, 4, 2, true, 0, 0.3, &error);
  ASSERT_TRUE(flushed) << error;
  EXPECT_LT(*flushed, 66.7 * 1.03);
  EXPECT_GT(*flushed, 10);
  auto streaming = process_pipeline_keys_per_s(stages, 4096, 4, 2, false, 0, 0.3, &error);
  ASSERT_TRUE(streaming) << error;
  std::printf("two keys, two stages: %.1f keys/s flushed (at most 66.7), %.1f streaming\n",
              *flushed, *streaming);
}

TEST(ProcessPipelineTest, CalibrationMeasuresTimeSlicingOnlyWhenStagesOutnumberTheCores) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::string error;
  actors::job_config roomy = balanced_job(std::min(cores, 2), 1, actors::pipeline_mode::async);
  roomy.data.synthetic_train = 640;
  auto profile = calibrate(roomy, 0.01, &error);
  ASSERT_TRUE(profile) << error;
  EXPECT_EQ(profile->time_slice_efficiency, 1.0);
  if (cores > 4) GTEST_SKIP() << cores << " cores: a job of more stages would take too long here";
  actors::job_config crowded = balanced_job(cores + 1, 1, actors::pipeline_mode::async);
  crowded.data.synthetic_train = 640;
  profile = calibrate(crowded, 0.01, &error);
  ASSERT_TRUE(profile) << error;
  // The share measured here depends on what else holds the cores while the stand-in runs
  // (`troupe calibrate` prints it); the fit that turns a rate into it is checked with given
  // rates in this_machine_test. Here: the profile carries the fitted share, exactly.
  std::printf("%d stages on %d cores: time_slice_efficiency %.3f\n", cores + 1, cores,
              profile->time_slice_efficiency);
  auto reread = parse_profile(to_json_text(*profile), "profile", &error);
  ASSERT_TRUE(reread) << error;
  EXPECT_EQ(reread->time_slice_efficiency, profile->time_slice_efficiency);
  nlohmann::json text = nlohmann::json::parse(to_json_text(*profile));
  text["time_slice_efficiency"] = 1.5;
  EXPECT_FALSE(parse_profile(text.dump(), "p.json", &error));
  EXPECT_EQ(error, "p.json: time_slice_efficiency: must be <= 1");
}

TEST(CalibrationTest, TimesAReplicatedStagesCopiesOnlyWithReplicas) {
  std::string error;
  actors::job_config alone = balanced_job(1, 1, actors::pipeline_mode::async);
  alone.data.synthetic_train = 640;
  auto profile = calibrate(alone, 0.01, &error);
  ASSERT_TRUE(profile) << error;
  EXPECT_EQ(profile->parameter_copy_s_per_float, 0.0);
  actors::job_config replicated = alone;
  replicated.parallelism.replicas = 2;
  profile = calibrate(replicated, 0.01, &error);
  ASSERT_TRUE(profile) << error;
  // Timed as the run copies them: some nanoseconds per float at most, never free.
  EXPECT_GT(profile->parameter_copy_s_per_float, 0.0);
  EXPECT_LT(profile->parameter_copy_s_per_float, 1e-7);
}

}  // namespace
}  // namespace troupe::sim
