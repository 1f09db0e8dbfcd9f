// What a simulated stage is charged for the replicas' sums (the ring's copies through host
// memory, or a shared-memory group's passes over the values in place) and for its copies of
// the weights.

#include <gtest/gtest.h>

#include <vector>

#include "sim/cost_model.h"
#include "sim/timed_stage_device.h"

namespace troupe::sim {
namespace {

/// A stage of one block with `parameters` floats, each copy of them timed at 1 ns per float.
timed_stage_device stage_of(int64_t parameters) {
  block_work block;
  block.type = "linear";
  block.parameters = parameters;
  stage_cost cost({block}, kernel_work{}, device_model{});
  cost.use_measured_parameter_copy(1e-9);
  return timed_stage_device(std::move(cost), {4}, {4}, nullptr);
}

/// Seconds charged for a sum of the gradients and for an average of the weights, as the stage
/// logic makes them (stage_logic.cpp: one read and a write back; two reads and a write back).
std::vector<double> sum_and_average(timed_stage_device& stage) {
  std::vector<float> values;
  stage.take_charge();
  stage.read_gradient_values(&values);
  stage.set_gradient_values(values);
  const double sum = stage.take_charge();
  stage.read_weight_values(&values);
  stage.read_weight_values(&values);
  stage.set_weight_values(values);
  return {sum, stage.take_charge()};
}

TEST(TimedStageDeviceTest, ASharedMemoryGroupIsChargedItsMemoryTrafficInsteadOfTheRingsCopies) {
  const double pass = 1000 * 1e-9;
  timed_stage_device ring = stage_of(1000);
  std::vector<double> seconds = sum_and_average(ring);
  // The ring: a copy out, its adds and copies of the chunks, a copy back; an average also
  // reads the weights again and averages three arrays into one.
  EXPECT_NEAR(seconds[0], 4 * pass, 1e-12);
  EXPECT_NEAR(seconds[1], 7 * pass, 1e-12);
  for (int ranks : {2, 3, 8}) {
    timed_stage_device shared = stage_of(1000);
    shared.sum_in_shared_memory(ranks);
    seconds = sum_and_average(shared);
    // A copy is three values of memory traffic: clearing the sum one, adding a rank's values
    // three, copying the sum back two, and scaling an average two.
    EXPECT_NEAR(seconds[0], (3.0 * ranks + 3) / 3 * pass, 1e-12) << ranks;
    EXPECT_NEAR(seconds[1], (3.0 * ranks + 5) / 3 * pass, 1e-12) << ranks;
  }
}

/// A stage of one measured linear block whose stash takes 1 ms and whose predicted stash
/// `predict_s`.
timed_stage_device measured_stage(double predict_s) {
  block_work block;
  block.type = "linear";
  block.parameters = 1000;
  stage_cost cost({block}, kernel_work{}, device_model{});
  block_profile measured;
  measured.type = "linear";
  measured.stash_s = 1e-3;
  measured.predict_s = predict_s;
  cost.use_measured({measured}, 32, 0);
  return timed_stage_device(std::move(cost), {4}, {4}, nullptr);
}

TEST(TimedStageDeviceTest, APredictedStashCostsWhatCalibrationMeasuredOrTwoStashes) {
  timed_stage_device measured = measured_stage(1.5e-3);
  measured.take_charge();
  measured.stash_weights(1);
  EXPECT_NEAR(measured.take_charge(), 1e-3, 1e-12);
  measured.stash_predicted_weights(2, 0.1f);
  EXPECT_NEAR(measured.take_charge(), 1.5e-3, 1e-12);
  // A profile from before calibration timed it: a copy, then a pass over it and the momentum.
  timed_stage_device estimated = measured_stage(0);
  estimated.take_charge();
  estimated.stash_predicted_weights(2, 0.1f);
  EXPECT_NEAR(estimated.take_charge(), 2e-3, 1e-12);
}

}  // namespace
}  // namespace troupe::sim
