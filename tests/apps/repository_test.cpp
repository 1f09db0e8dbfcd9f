// Rules of the repository itself: the README's two commands, CI running the second one
// verbatim, and the layering of DESIGN.md (which folder may include what).

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
const fs::path source_dir = TROUPE_SOURCE_DIR;

std::string read_file(const fs::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

/// The lines inside the README's first fenced code block.
std::vector<std::string> first_code_block() {
  std::vector<std::string> block;
  bool inside = false;
  for (const std::string& line : lines_of(read_file(source_dir / "README.md"))) {
    if (line.rfind("```", 0) == 0) {
      if (inside) return block;
      inside = true;
    } else if (inside) {
      block.push_back(line);
    }
  }
  return {};
}

TEST(RepositoryTest, ReadmeOpensWithExactlyTwoCommands) {
  auto block = first_code_block();
  ASSERT_EQ(block.size(), 2u);
  EXPECT_NE(block[0].find("apt-get install"), std::string::npos);
  EXPECT_NE(block[0].find("troupe train apps/examples/fashion_mlp.toml"), std::string::npos);
  EXPECT_NE(block[1].find("apt-get install"), std::string::npos);
  EXPECT_NE(block[1].find("ctest"), std::string::npos);
}

TEST(RepositoryTest, CiRunsTheReadmeTestCommandVerbatim) {
  auto block = first_code_block();
  ASSERT_EQ(block.size(), 2u);
  auto ci = lines_of(read_file(source_dir / ".ci" / "run"));
  EXPECT_NE(std::find(ci.begin(), ci.end(), block[1]), ci.end())
      << ".ci/run must contain the README's second command as one line";
}

/// Files under `folder` (relative to the source root) whose text matches `pattern`.
std::vector<std::string> files_matching(const std::string& folder, const std::regex& pattern) {
  std::vector<std::string> hits;
  for (const auto& entry : fs::recursive_directory_iterator(source_dir / folder)) {
    const std::string extension = entry.path().extension().string();
    if (!entry.is_regular_file() ||
        (extension != ".h" && extension != ".cpp" && extension != ".cu" && extension != ".cuh")) {
      continue;
    }
    if (std::regex_search(read_file(entry.path()), pattern)) {
      hits.push_back(fs::relative(entry.path(), source_dir).string());
    }
  }
  return hits;
}

TEST(RepositoryTest, LayersIncludeNeitherCafNorZeroMq) {
  const std::regex forbidden(R"(#include\s*[<"](caf/|zmq))");
  EXPECT_TRUE(files_matching("layers", forbidden).empty());
  const std::regex caf(R"(#include\s*[<"]caf/)");
  EXPECT_TRUE(files_matching("transport", caf).empty());
}

/// Files under `folder` that include a header matching `pattern`, except those under
/// `allowed_folder` (relative to the source root; empty: none).
std::vector<std::string> includers(const std::string& folder, const std::string& pattern,
                                   const std::string& allowed_folder = "") {
  std::vector<std::string> hits;
  for (const std::string& hit :
       files_matching(folder, std::regex("#include\\s*[<\"](" + pattern + ")"))) {
    if (allowed_folder.empty() || hit.rfind(allowed_folder, 0) != 0) hits.push_back(hit);
  }
  return hits;
}

TEST(RepositoryTest, TheSimulatorsCoreRunsInVirtualTimeWithoutCafOrSockets) {
  // The simulator hosts the engine's logic; only sim/calibration/ measures the real machine.
  EXPECT_EQ(includers("sim", "caf/|zmq|transport/|actors/(hosts|cluster)/", "sim/calibration/"),
            std::vector<std::string>{});
  EXPECT_EQ(includers("sim", "caf/|actors/cluster/"), std::vector<std::string>{});
}

TEST(RepositoryTest, EachRoomOfTheEngineIncludesOnlyTheRoomsBelowIt) {
  // config <- engine <- storage <- hosts <- cluster; CAF in the hosts and cluster rooms alone.
  EXPECT_EQ(
      includers("actors/config", "caf/|zmq|transport/|actors/(engine|storage|hosts|cluster)/"),
      std::vector<std::string>{});
  EXPECT_EQ(includers("actors/engine",
                      "caf/|zmq|transport/|chrono>|ctime>|actors/(storage|hosts|cluster)/"),
            std::vector<std::string>{})
      << "the engine is logic without I/O: no CAF, no sockets, no clock";
  EXPECT_EQ(includers("actors/storage", "caf/|zmq|transport/|actors/(hosts|cluster)/"),
            std::vector<std::string>{});
  EXPECT_EQ(includers("actors/hosts", "actors/cluster/"), std::vector<std::string>{});
  for (const char* folder :
       {"apps", "layers", "sim", "transport", "actors/config", "actors/engine", "actors/storage"}) {
    EXPECT_EQ(includers(folder, "caf/"), std::vector<std::string>{}) << folder;
  }
  for (const char* folder : {"actors", "apps", "layers", "sim"}) {
    // ZeroMQ is transport's; the transport benchmark holds raw ZeroMQ against troupe's frames.
    for (const std::string& hit : includers(folder, "zmq")) {
      EXPECT_EQ(hit.rfind("apps/bench/bench_transport", 0), 0u) << hit;
    }
    EXPECT_EQ(includers(folder, "tests/"), std::vector<std::string>{})
        << folder << " includes a test driver";
  }
}

TEST(RepositoryTest, EachRoomOfTheCommandLineIncludesOnlyTheRoomsBelowIt) {
  // dashboard <- cli <- lab, bench (with lab's statistics); cli/commands.h declares every
  // room's commands, and cli/main.cpp dispatches to them.
  EXPECT_EQ(includers("apps/dashboard", R"(apps/(lab|bench|plot)/|apps/cli/(?!commands\.h))"),
            std::vector<std::string>{});
  EXPECT_EQ(includers("apps/cli", "apps/(lab|bench|plot)/", "apps/cli/main.cpp"),
            std::vector<std::string>{});
  EXPECT_EQ(includers("apps/lab", "apps/(bench|plot|dashboard)/"), std::vector<std::string>{});
  EXPECT_EQ(includers("apps/bench", R"(apps/(plot|dashboard)/|apps/lab/(?!statistics\.h))"),
            std::vector<std::string>{});
  EXPECT_EQ(includers("apps/plot", R"(apps/(?!cli/commands\.h))"), std::vector<std::string>{});
}

TEST(RepositoryTest, CudaHeadersOnlyInLayersCuda) {
  const std::regex cuda(R"(#include\s*[<"](cuda_runtime|cublas|cuda\.h|cuda_bf16|cuda_fp16))");
  for (const char* folder : {"actors", "apps", "sim", "transport"}) {
    EXPECT_TRUE(files_matching(folder, cuda).empty()) << folder;
  }
  for (const std::string& hit : files_matching("layers", cuda)) {
    EXPECT_EQ(hit.rfind("layers/cuda/", 0), 0u) << hit;
  }
}

TEST(RepositoryTest, OnlyTheRegistryTestsForCudaBuilds) {
  const std::regex guard(R"(#if(def)?\s+(defined\()?TROUPE_WITH_CUDA)");
  std::vector<std::string> hits;
  for (const char* folder : {"actors", "apps", "layers", "sim", "transport"}) {
    for (auto& hit : files_matching(folder, guard)) hits.push_back(hit);
  }
  EXPECT_EQ(hits, std::vector<std::string>{"layers/backend_registry.cpp"});
}

/// Table cells of a Markdown file longer than `limit` characters, as "FILE:LINE (N chars)".
std::vector<std::string> long_table_cells(const fs::path& file, size_t limit) {
  std::vector<std::string> hits;
  const std::vector<std::string> lines = lines_of(read_file(source_dir / file));
  for (size_t number = 0; number < lines.size(); ++number) {
    if (lines[number].rfind("|", 0) != 0) continue;
    std::istringstream cells(lines[number]);
    for (std::string cell; std::getline(cells, cell, '|');) {
      if (cell.size() > limit) {
        hits.push_back(file.string() + ":" + std::to_string(number + 1) + " (" +
                       std::to_string(cell.size()) + " chars)");
      }
    }
  }
  return hits;
}

TEST(RepositoryTest, TheReadmeIsAShortFrontDoor) {
  const std::string readme = read_file(source_dir / "README.md");
  EXPECT_LE(lines_of(readme).size(), 300u) << "reference belongs in docs/guide/";
  EXPECT_EQ(readme.find("../shared"), std::string::npos) << "the README points outside";
  EXPECT_EQ(long_table_cells("README.md", 320), std::vector<std::string>{});
}

TEST(RepositoryTest, ResultsHoldOneCurrentFigurePerCell) {
  // Measurements keep one current figure with its date, commit and command; history is git's.
  EXPECT_EQ(long_table_cells(fs::path("docs") / "results.md", 320), std::vector<std::string>{});
}

TEST(RepositoryTest, EveryGuidePageTheReadmeLinksExists) {
  const std::string readme = read_file(source_dir / "README.md");
  const std::regex link(R"(\]\((docs/[^)#]+))");
  int links = 0;
  for (auto it = std::sregex_iterator(readme.begin(), readme.end(), link);
       it != std::sregex_iterator(); ++it, ++links) {
    EXPECT_TRUE(fs::exists(source_dir / (*it)[1].str())) << (*it)[1].str();
  }
  EXPECT_GE(links, 10);
}

}  // namespace
