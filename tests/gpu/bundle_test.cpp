// The device bundle, checked without a GPU: a bundle of this build is self-contained (and the
// check that says so names a library that goes missing), and its device check on this machine
// runs to its end, reports every GPU step as skipped and still writes a valid summary.json.

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

struct command_result {
  int status = -1;
  std::string output;
};

/// Runs `command` through the shell, standard error folded into standard output.
command_result run(const std::string& command) {
  command_result result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;)
    result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

/// A scratch directory of one test, removed at its end.
class scratch_directory {
 public:
  scratch_directory() {
    std::string pattern = (fs::temp_directory_path() / "troupe-bundle-test-XXXXXX").string();
    path_ = mkdtemp(pattern.data()) ? pattern : "";
  }
  ~scratch_directory() {
    std::error_code ignored;
    if (!path_.empty()) fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const std::string source = TROUPE_SOURCE_DIR;

/// Packs this build into `bundle` as tests/gpu/bundle.sh does, without building again, and at
/// its own compression: the size check needs the bundle a device call carries (xz -1 packs
/// the libraries 4 MiB larger).
void make_bundle(const std::string& bundle) {
  const auto made =
      run(source + "/tests/gpu/bundle.sh --no-build --build-dir " TROUPE_BUILD_DIR " " + bundle);
  ASSERT_EQ(made.status, 0) << made.output;
}

bool gpu_present() { return run("nvidia-smi -L 2>/dev/null | grep -q '^GPU '").status == 0; }

TEST(DeviceBundleTest, EveryLibraryResolvesInTheBundleOrTheDeviceImage) {
  scratch_directory scratch;
  const std::string bundle = scratch.path() + "/bundle";
  ASSERT_NO_FATAL_FAILURE(make_bundle(bundle));
  const auto checked = run(source + "/tests/gpu/check_bundle.sh " + bundle);
  EXPECT_EQ(checked.status, 0) << checked.output;
  EXPECT_NE(checked.output.find("is self-contained"), std::string::npos) << checked.output;
  // What the device image lacks was copied in (ZeroMQ, CAF, OpenBLAS at least), libraries over
  // 1 MiB packed with xz.
  EXPECT_TRUE(fs::exists(bundle + "/lib/libzmq.so.5"));
  EXPECT_TRUE(fs::exists(bundle + "/lib/libcaf_core.so.0.17.6.xz"));
  EXPECT_TRUE(fs::exists(bundle + "/lib/libopenblas.so.0.xz"));
  const auto help = run("TMPDIR=" + scratch.path() + " " + bundle + "/run.sh troupe --help");
  EXPECT_EQ(help.status, 0) << help.output;
  EXPECT_FALSE(fs::exists(bundle + "/lib/libopenblas.so.0")) << "run.sh unpacks outside the bundle";

  // The same bundle without ZeroMQ is not self-contained, and the check names what is missing.
  fs::remove(bundle + "/lib/libzmq.so.5");
  const auto broken = run(source + "/tests/gpu/check_bundle.sh " + bundle);
  EXPECT_EQ(broken.status, 1) << broken.output;
  EXPECT_NE(broken.output.find("needs libzmq.so.5, which is neither in"), std::string::npos)
      << broken.output;
}

TEST(DeviceBundleTest, TheCheckWithoutAGpuSkipsEveryGpuStepAndWritesItsSummary) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present: the check would measure it";
  scratch_directory scratch;
  const std::string bundle = scratch.path() + "/bundle", out = scratch.path() + "/out";
  ASSERT_NO_FATAL_FAILURE(make_bundle(bundle));
  const auto checked = run("TMPDIR=" + scratch.path() + " OUT=" + out + " " + source +
                           "/tests/gpu/device_check.sh " + bundle);
  ASSERT_EQ(checked.status, 0) << checked.output;

  std::ifstream file(out + "/summary.json");
  const nlohmann::json summary = nlohmann::json::parse(file, nullptr, false);
  ASSERT_TRUE(summary.is_object()) << "summary.json is missing or not JSON\n" << checked.output;
  EXPECT_FALSE(summary["gpu"]["present"].get<bool>());
  EXPECT_EQ(summary["failed_steps"], 0);
  const auto& steps = summary["steps"];
  ASSERT_GE(steps.size(), 11u) << steps.dump(2);
  for (const auto& step : steps) EXPECT_EQ(step["status"], "skipped") << step.dump();
  for (const auto& bar : summary["bars"]) EXPECT_EQ(bar["status"], "not measured") << bar.dump();
  EXPECT_EQ(summary["bundle"]["executables"].size(), 4u);

  // The bundled test executables ran here: the CPU precision tests passed and the CUDA ones
  // skipped themselves.
  const auto& layers = summary["tests"]["layers"];
  ASSERT_TRUE(layers.is_object()) << summary["tests"].dump();
  EXPECT_GT(layers["tests"].get<int>(), 0);
  EXPECT_EQ(layers["failures"].get<int>(), 0);
  if (summary["bundle"]["cuda"].get<bool>()) {
    EXPECT_GT(layers["skipped"].get<int>(), 0);
  }
  EXPECT_GT(summary["tests"]["actors"]["tests"].get<int>(), 0);
  EXPECT_LE(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 8)
      << "a device call brings back at most 8 files";
}

}  // namespace
