// A layer type registered by a program that embeds troupe: job files name it with keys of its
// own, the registry refuses names that are taken, and a pipeline builds and trains it.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/hosts/pipeline_host.h"
#include "layers/layer_registry.h"
#include "tests/support/engine_helpers.h"

namespace troupe::actors {
namespace {

/// "doubled_relu": a relu under a name of its own, with a key of its own (`factor`, which the
/// job file must accept and hand over; the layer itself ignores it).
layers::custom_layer_type doubled_relu() {
  layers::custom_layer_type type;
  type.options = {"factor"};
  type.output_shape = [](const layers::layer_spec&, const layers::shape& input,
                         layers::shape* output, std::string*) {
    *output = input;
    return true;
  };
  type.make = [](layers::backend& device, layers::stream s, const layers::layer_spec& spec,
                 const layers::shape& input, const layers::shape& output, uint64_t seed) {
    layers::layer_spec relu;
    relu.type = "relu";
    (void)spec, (void)output;
    return layers::make_layer(device, s, relu, input, seed, 0);
  };
  return type;
}

void register_once() {
  static const bool registered = [] {
    std::string error;
    const bool done = layers::register_layer_type("doubled_relu", doubled_relu(), &error);
    EXPECT_TRUE(done) << error;
    return done;
  }();
  ASSERT_TRUE(registered);
}

const char* job = R"(
[model]
input_shape = [12]
layers = [{ type = "linear", out = 16 }, { type = "doubled_relu", factor = 2.5 },
          { type = "linear", out = 4 }]
)";

/// The rest of the job, as --set would give it: synthetic data, 2 async stages.
std::vector<std::string> settings(std::vector<std::string> more = {}) {
  std::vector<std::string> all = {"data.dataset=synthetic", "data.synthetic_train=256",
                                  "data.synthetic_test=64", "data.classes=4",
                                  "parallelism.stages=2",   "parallelism.mode=async",
                                  "training.batch_size=16"};
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

TEST(CustomLayerTypeTest, TheRegistryRefusesTakenNamesAndIncompleteTypes) {
  register_once();
  std::string error;
  EXPECT_FALSE(layers::register_layer_type("linear", doubled_relu(), &error));
  EXPECT_EQ(error, "layer type 'linear' is built in");
  EXPECT_FALSE(layers::register_layer_type("linear_tail", doubled_relu(), &error));
  EXPECT_EQ(error, "layer type 'linear_tail' is built in");
  EXPECT_FALSE(layers::register_layer_type("doubled_relu", doubled_relu(), &error));
  EXPECT_EQ(error, "layer type 'doubled_relu' is already registered");
  EXPECT_FALSE(layers::register_layer_type("half", layers::custom_layer_type{}, &error));
  EXPECT_EQ(error, "layer type 'half' needs output_shape and make");
}

TEST(CustomLayerTypeTest, AJobNamesItWithItsOwnKeysAndAPipelineTrainsIt) {
  register_once();
  job_error problem;
  auto config = parse_job(job, "custom job", settings(), &problem);
  ASSERT_TRUE(config) << problem.message;
  EXPECT_EQ(config->model.layers[1].options.at("factor"), 2.5);
  EXPECT_FALSE(parse_job(job, "custom job",
                         settings({"model.layers=[{type=\"doubled_relu\", factr=1}]"}), &problem));
  EXPECT_NE(problem.message.find("did you mean 'factor'?"), std::string::npos) << problem.message;
  EXPECT_FALSE(
      parse_job(job, "custom job", settings({"model.layers=[{type=\"tripled_relu\"}]"}), &problem));
  EXPECT_NE(problem.message.find("doubled_relu"), std::string::npos) << problem.message;

  std::string error;
  auto data = load_job_data(*config, &error);
  ASSERT_TRUE(data) << error;
  testing::wall_clock clock;
  quiet_observer observer;
  auto report = run_pipeline(*config, *data, observer, clock, {}, &error);
  ASSERT_TRUE(report) << error;
  EXPECT_EQ(report->summary.steps, 16);
}

}  // namespace
}  // namespace troupe::actors
