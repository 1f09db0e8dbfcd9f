// A job that asks for more memory than the machine has: `troupe train` refuses it before it
// allocates anything, naming the estimate, the machine's memory and the keys to change; an
// allocation that fails anyway ends the command with one line and exit status 2.

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <filesystem>
#include <string>

#include "tests/support/cli_helpers.h"

namespace {

namespace fs = std::filesystem;

using namespace troupe::testing;

class MemoryCliTest : public troupe_command_test {
 protected:
  /// A convolution over [3, 20000, 20000] images in keys of 8: per sample it keeps 43.2 GB of
  /// unfolded input and 25.6 GB of relu output, 550.4 GB per key; its 16 synthetic images
  /// alone are 76.8 GB.
  fs::path huge_job() {
    return write("huge.toml", R"(
[model]
input_shape = [3, 20000, 20000]
layers = [{ type = "conv2d", out = 16, kernel = 3, padding = 1 }, { type = "relu" },
          { type = "maxpool2d", kernel = 1000 }, { type = "flatten" }, { type = "linear", out = 4 }]
)" + synthetic_data(8, 8) + R"(
[training]
batch_size = 8
)");
  }
};

TEST_F(MemoryCliTest, TrainRefusesAJobThatNeedsHundredsOfGigabytesPerKeyBeforeTraining) {
  const fs::path out = directory_ / "run";
  const run_result result = troupe("train " + huge_job().string() + " --out " + out.string());
  expect_one_line(result, "550.4 GB of activations for one key of 8 samples");
  EXPECT_NE(result.errors.find("76.8 GB of data) but this machine has "), std::string::npos)
      << result.errors;
  EXPECT_NE(result.errors.find("lower training.batch_size (or raise parallelism.micro_batches) "
                               "or shrink model.input_shape"),
            std::string::npos)
      << result.errors;
  EXPECT_FALSE(fs::exists(out)) << "refused before anything was written";
}

TEST_F(MemoryCliTest, AnAllocationThatFailsEndsTheCommandWithOneLineAndStatus2) {
  // The simulator makes the job's data set before it simulates: 76.8 GB, more than this
  // process may map (the limit makes the outcome the same on a machine of any size).
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &before), 0);
  rlimit limited = before;
  limited.rlim_cur = rlim_t(16) << 30;
  ASSERT_EQ(setrlimit(RLIMIT_AS, &limited), 0);
  const run_result result =
      troupe("simulate " + huge_job().string() + " --cluster " + TROUPE_SOURCE_DIR +
             "/apps/examples/cluster_this_machine.toml --out " + (directory_ / "sim").string());
  ASSERT_EQ(setrlimit(RLIMIT_AS, &before), 0);
  expect_one_line(result,
                  "troupe: out of host memory (std::bad_alloc): the job needs more "
                  "memory than this machine has; lower training.batch_size");
}

}  // namespace
