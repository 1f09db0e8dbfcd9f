// The device bundle, checked without a GPU: a bundle of this build is self-contained (and the
// check that says so names a library that goes missing), and its device check on this machine
// runs to its end, reports every GPU step as skipped and still writes a valid summary.json.
// The check's own logic, without a GPU: its filters name every GPU test in the sources, and
// its verdicts on gtest reports fail a GPU machine's step whose GPU tests all skipped.

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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

/// Runs `commands` in bash with tests/gpu/device_check.sh sourced (its functions only).
command_result with_device_check(const std::string& commands) {
  const std::string script = "source '" + source + "/tests/gpu/device_check.sh' && " + commands;
  std::string quoted = "'";
  for (char c : script) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return run("bash -c " + quoted + "'");
}

/// Whether `text` matches the gtest filter pattern `pattern` (* and ? wildcards).
bool wildcard_match(const char* pattern, const char* text) {
  if (*pattern == '\0') return *text == '\0';
  if (*pattern == '*')
    return wildcard_match(pattern + 1, text) || (*text && wildcard_match(pattern, text + 1));
  return *text && (*pattern == '?' || *pattern == *text) && wildcard_match(pattern + 1, text + 1);
}

/// Whether the positive gtest filter `filter` (patterns joined by ':') selects `test`.
bool selects(const std::string& filter, const std::string& test) {
  std::stringstream patterns(filter);
  for (std::string pattern; std::getline(patterns, pattern, ':');) {
    if (wildcard_match(pattern.c_str(), test.c_str())) return true;
  }
  return false;
}

struct test_source {
  std::string file;
  std::string suite;
  std::string name;
  std::string body;  ///< up to the next test
};

/// Every TEST and TEST_F under tests/`folder`, read here independently of the check's awk.
std::vector<test_source> tests_under(const std::string& folder) {
  std::vector<test_source> found;
  const std::regex header(R"(\n(TEST|TEST_F)\(\s*(\w+),\s*(\w+)\))");
  for (const auto& entry : fs::recursive_directory_iterator(source + "/tests/" + folder)) {
    if (entry.path().extension() != ".cpp") continue;
    std::ifstream file(entry.path());
    const std::string text((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
    std::vector<std::smatch> headers;
    for (std::sregex_iterator it(text.begin(), text.end(), header), end; it != end; ++it)
      headers.push_back(*it);
    for (size_t i = 0; i < headers.size(); ++i) {
      const size_t start = headers[i].position(0);
      const size_t stop = i + 1 < headers.size() ? headers[i + 1].position(0) : text.size();
      found.push_back({entry.path().filename().string(), headers[i][2], headers[i][3],
                       text.substr(start, stop - start)});
    }
  }
  return found;
}

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

TEST(DeviceCheckTest, ItsFiltersSelectEveryGpuTestOfTheSources) {
  for (const std::string folder : {"layers", "actors"}) {
    const auto printed =
        with_device_check("gpu_test_filter " + folder + " \"$" + folder + "_extra\"");
    ASSERT_EQ(printed.status, 0) << printed.output;
    const std::string filter = printed.output.substr(0, printed.output.find('\n'));
    const std::vector<test_source> tests = tests_under(folder);
    ASSERT_GT(tests.size(), 50u) << folder;
    // Suites of CUDA's own files, or named for CUDA, a GPU or NCCL, and the precision and
    // device-group suites, whole; elsewhere every test that asks whether there is a device.
    const std::regex gpu_name("Cuda|Gpu|Nccl");
    std::set<std::string> whole_suites = {"GemmPrecisionTest", "DeviceGroupTest"};
    for (const test_source& test : tests) {
      if (test.file.rfind("cuda_", 0) == 0 || std::regex_search(test.suite, gpu_name))
        whole_suites.insert(test.suite);
    }
    int selected = 0;
    for (const test_source& test : tests) {
      const bool gpu = whole_suites.count(test.suite) > 0 ||
                       std::regex_search(test.name, gpu_name) ||
                       test.body.find("cuda_device_count()") != std::string::npos ||
                       test.body.find("nccl_compiled()") != std::string::npos;
      if (!gpu) continue;
      ++selected;
      EXPECT_TRUE(selects(filter, test.suite + "." + test.name))
          << test.suite << "." << test.name << " (" << test.file << ") is not in " << filter;
    }
    EXPECT_GE(selected, 4) << folder;
  }
  const auto layers = with_device_check("gpu_test_filter layers \"$layers_extra\"");
  for (const char* suite : {"CudaBackendTest.*", "CudaParityTest.*", "CudaTransformerParityTest.*",
                            "GemmPrecisionTest.*", "DeviceGroupTest.*"}) {
    EXPECT_NE((":" + layers.output).find(std::string(":") + suite), std::string::npos)
        << suite << " in " << layers.output;
  }
}

/// A gtest XML report of tests each "passed", "failed", "no device" (skipped for want of a
/// CUDA device) or "other skip" (skipped for another reason), as the test executables write it.
std::string gtest_report(const std::vector<std::string>& outcomes) {
  int failures = 0;
  std::string cases;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const std::string& outcome = outcomes[i];
    const std::string name = "<testcase name=\"Test" + std::to_string(i) +
                             "\" file=\"t.cpp\" line=\"1\" status=\"run\" result=\"";
    if (outcome == "passed") {
      cases += "    " + name + "completed\" time=\"0\" classname=\"CudaParityTest\" />\n";
    } else if (outcome == "failed") {
      ++failures;
      cases += "    " + name +
               "completed\" time=\"0\" classname=\"CudaParityTest\">\n"
               "      <failure message=\"t.cpp:3&#x0A;Expected equality\" type=\"\"/>\n"
               "      <failure message=\"t.cpp:4&#x0A;Expected equality\" type=\"\"/>\n"
               "    </testcase>\n";
    } else {
      const std::string why = outcome == "no device" ? "no CUDA device" : "needs 2 GPUs";
      cases += "    " + name +
               "skipped\" time=\"0\" classname=\"CudaParityTest\">\n"
               "      <skipped message=\"t.cpp:2&#x0A;" +
               why + "\"><![CDATA[t.cpp:2\n" + why + "]]></skipped>\n    </testcase>\n";
    }
  }
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites tests=\"" +
         std::to_string(outcomes.size()) + "\" failures=\"" + std::to_string(failures) +
         "\" disabled=\"0\" errors=\"0\" time=\"0\" name=\"AllTests\">\n"
         "  <testsuite name=\"CudaParityTest\" tests=\"" +
         std::to_string(outcomes.size()) + "\">\n" + cases + "  </testsuite>\n</testsuites>\n";
}

TEST(DeviceCheckTest, AGpuMachinesStepFailsWhenItsGpuTestsSkipped) {
  scratch_directory scratch;
  struct verdict_case {
    std::string gpu, cuda_built;
    int status;
    std::vector<std::string> outcomes;  // none: no report
    std::string expected;               // its start
  };
  const std::vector<verdict_case> cases = {
      {"yes", "yes", 0, {"passed", "passed", "other skip"}, "passed\t3 tests, 0 failed, 1 skipped"},
      {"yes",
       "yes",
       0,
       {"no device", "no device", "no device"},
       "failed\tevery test skipped though nvidia-smi lists a GPU: 3 tests, 0 failed, 3 skipped"},
      {"yes", "yes", 0, {"other skip"}, "failed\tevery test skipped"},
      {"yes", "yes", 0, {"passed", "no device"}, "failed\t1 found no CUDA device"},
      {"yes", "no", 0, {"passed"}, "failed\ta GPU, but the bundle was built without CUDA"},
      {"yes",
       "yes",
       1,
       {"passed", "failed"},
       "failed\texit status 1: 2 tests, 1 failed, 0 skipped"},
      {"yes", "yes", 0, {}, "failed\tthe filter matched no test"},
      {"no",
       "yes",
       0,
       {"no device", "passed"},
       "skipped\tno GPU (nvidia-smi is missing or lists "
       "none): 2 tests, 0 failed, 1 skipped"},
      {"no", "no", 0, {"no device"}, "skipped\tno GPU"},
      {"no", "yes", 0, {}, "failed\tthe filter matched no test"},
  };
  int index = 0;
  for (const verdict_case& c : cases) {
    const std::string xml = scratch.path() + "/report-" + std::to_string(index++) + ".xml";
    std::ofstream(xml) << gtest_report(c.outcomes);
    const auto verdict = with_device_check("gpu_tests_verdict " + c.gpu + " " + c.cuda_built + " " +
                                           std::to_string(c.status) + " " + xml);
    EXPECT_EQ(verdict.output.rfind(c.expected, 0), 0u)
        << "GPU " << c.gpu << ", CUDA " << c.cuda_built << ", status " << c.status << ": "
        << verdict.output;
  }
  const auto missing =
      with_device_check("gpu_tests_verdict no yes 0 " + scratch.path() + "/none.xml");
  EXPECT_EQ(missing.output, "failed\tno gtest XML report\n");
}

}  // namespace
