// The weight comparison behind every "equals sequential" check: a NaN or an infinity in one
// weight, or weights of another shape, make it fail, whichever way the check points.

#include "tests/support/job_helpers.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <limits>

#include "actors/config/job_data.h"
#include "tests/support/local_pipeline.h"

namespace troupe::testing {
namespace {

const float nan_value = std::numeric_limits<float>::quiet_NaN();
const float infinity = std::numeric_limits<float>::infinity();

TEST(WeightComparisonTest, APlantedNanMakesTheEqualsSequentialCheckFail) {
  // A 2-stage sync pipeline equals the sequential trainer, as pipeline_test checks...
  const actors::job_config config = small_pipeline_job(2, 2, actors::pipeline_mode::sync,
                                                       actors::pipeline_schedule::one_f_one_b, 320);
  std::string error;
  auto data = actors::load_job_data(config, &error);
  ASSERT_TRUE(data) << error;
  auto device = layers::create_backend("cpu", 1, &error);
  ASSERT_TRUE(device) << error;
  const int64_t steps = 10;
  actors::local_pipeline pipeline(config, *device, data->train.count(), steps, 0);
  pipeline.train(data->train, steps);
  const weights expected = sequential_weights(config, data->train, steps);
  weights actual = pipeline.weights();
  EXPECT_LE(max_relative_difference(actual, expected), 1e-5);
  // ...until one weight of one tensor is NaN: both "equals" and "differs" checks fail.
  actual[1][actual[1].size() / 2] = nan_value;
  EXPECT_NONFATAL_FAILURE(EXPECT_LE(max_relative_difference(actual, expected), 1e-5),
                          "max_relative_difference(actual, expected)");
  EXPECT_NONFATAL_FAILURE(EXPECT_GT(max_relative_difference(actual, expected), 1e-3),
                          "max_relative_difference(actual, expected)");
  // The same for a NaN in the reference.
  EXPECT_NONFATAL_FAILURE(EXPECT_LE(max_relative_difference(expected, actual), 1e-5),
                          "max_relative_difference");
}

TEST(WeightComparisonTest, NonFiniteValuesAndOtherShapesAreNotComparable) {
  const weights reference = {{1, -2, 3}, {0.5f}};
  EXPECT_EQ(max_relative_difference(reference, reference), 0.0);
  EXPECT_NEAR(max_relative_difference({{1, -2, 3.3f}, {0.5f}}, reference), 0.1, 1e-6);
  for (const weights& other : {weights{{1, -2, 3}, {nan_value}}, weights{{1, -2, infinity}, {0.5f}},
                               weights{{1, -2, 3}}, weights{{1, -2, 3}, {0.5f}, {1}},
                               weights{{1, -2}, {0.5f}}, weights{{1, -2, 3}, {0.5f, 0.5f}}}) {
    EXPECT_TRUE(std::isnan(max_relative_difference(other, reference)));
    EXPECT_TRUE(std::isnan(max_relative_difference(reference, other)));
  }
  EXPECT_TRUE(std::isnan(max_relative_difference({}, {}))) << "no weights compared";
  // A tensor of zeros is compared absolutely, not as 0 / 0.
  EXPECT_EQ(max_relative_difference({{0, 0}}, {{0, 0}}), 0.0);
  EXPECT_FLOAT_EQ(max_relative_difference({{0, 0.25f}}, {{0, 0}}), 0.25);
}

}  // namespace
}  // namespace troupe::testing
