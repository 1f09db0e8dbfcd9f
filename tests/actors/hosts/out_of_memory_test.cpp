// An allocation that fails inside a stage actor ends the process with one line saying which
// stage ran out of what, and exit status 2: neither an abort nor a run left waiting for a stage
// that ended.

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "actors/config/job_data.h"
#include "actors/hosts/pipeline_host.h"
#include "layers/layer_registry.h"
#include "layers/out_of_memory.h"
#include "tests/support/engine_helpers.h"
#include "tests/support/job_helpers.h"

namespace troupe::actors {
namespace {

/// A block whose forward pass asks for a terabyte and does not get it.
class greedy_layer final : public layers::layer {
 public:
  explicit greedy_layer(const layers::shape& shape) : layer(shape, shape) {}
  const char* type() const override { return "greedy"; }
  layers::forward_result forward(const layers::run_options&, const layers::tensor&) override {
    throw layers::out_of_memory("host memory", size_t(1) << 40);
  }
  layers::tensor backward(const layers::run_options&, layers::layer_context&, const layers::tensor&,
                          bool) override {
    return {};
  }
};

void register_greedy_layer() {
  static const bool registered = [] {
    layers::custom_layer_type type;
    type.output_shape = [](const layers::layer_spec&, const layers::shape& input,
                           layers::shape* output, std::string*) {
      *output = input;
      return true;
    };
    type.make = [](layers::backend&, layers::stream, const layers::layer_spec&,
                   const layers::shape& input, const layers::shape&,
                   uint64_t) { return std::make_unique<greedy_layer>(input); };
    std::string error;
    const bool done = layers::register_layer_type("greedy", type, &error);
    EXPECT_TRUE(done) << error;
    return done;
  }();
  ASSERT_TRUE(registered);
}

/// Trains `config` through the stage actors; returns only if the run does.
void train(const job_config& config) {
  std::string error;
  auto data = load_job_data(config, &error);
  if (!data) return;
  testing::wall_clock clock;
  quiet_observer observer;
  run_pipeline(config, *data, observer, clock, pipeline_options{}, &error);
}

TEST(OutOfMemoryTest, AStageThatRunsOutOfMemoryEndsTheProcessWithOneLineAndStatus2) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child starts afresh, without threads
  register_greedy_layer();
  job_config config =
      testing::small_pipeline_job(2, 1, pipeline_mode::async, pipeline_schedule::gpipe, 64);
  // Stage 1 of 2 (blocks 4 to 8, uniform) holds the greedy block.
  config.model.layers.insert(config.model.layers.begin() + 5, testing::block("greedy"));
  config.model.layers.erase(config.model.layers.begin() + 2);  // the dropout: 8 blocks again
  config.parallelism.threads = 2;
  EXPECT_EXIT(train(config), ::testing::ExitedWithCode(2),
              "troupe: stage 1: out of host memory allocating 1099.5 GB \\(1099511627776 bytes\\): "
              "the job needs more memory than this machine has; lower training.batch_size");
}

}  // namespace
}  // namespace troupe::actors
