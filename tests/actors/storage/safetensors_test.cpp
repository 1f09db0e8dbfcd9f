#include "actors/storage/safetensors.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>

#include "actors/config/layer_cuts.h"
#include "actors/engine/partition.h"
#include "actors/engine/stage_device.h"
#include "actors/storage/model_weights.h"
#include "layers/backend_registry.h"
#include "tests/support/job_helpers.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

uint32_t bits_of(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

std::string little_endian(uint64_t value, int bytes) {
  std::string text;
  for (int i = 0; i < bytes; ++i) text += static_cast<char>((value >> (8 * i)) & 0xff);
  return text;
}

/// Tensors whose bits a lossy or byte-swapping writer would change: signed zero, infinities,
/// a NaN payload, a denormal; and a scalar, an empty and a three-dimensional shape.
std::vector<named_tensor> awkward_tensors() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float denormal = std::numeric_limits<float>::denorm_min();
  return {{"linear0.weight", {2, 3}, {0.0f, -0.0f, 1.5f, -2.25f, nan, denormal}},
          {"linear0.bias", {3}, {INFINITY, -INFINITY, std::numeric_limits<float>::max()}},
          {"scalar", {}, {3.0f}},
          {"empty", {0, 4}, {}},
          {"cube", {2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8}}};
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "troupe-safetensors-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    directory_ = pattern;
  }
  void TearDown() override { fs::remove_all(directory_); }

  std::string path(const std::string& name) const { return (fs::path(directory_) / name).string(); }

  /// A file with `header` as its JSON (length prefix added) followed by `data`.
  std::string hand_made(const std::string& header, const std::string& data) {
    const std::string file = path("hand_made.safetensors");
    std::ofstream(file, std::ios::binary) << little_endian(header.size(), 8) << header << data;
    return file;
  }

  /// read_safetensors' error for `file`, which must be refused.
  std::string refusal(const std::string& file) {
    std::string error;
    EXPECT_FALSE(read_safetensors(file, &error).has_value());
    EXPECT_NE(error.find(file), std::string::npos) << error;
    return error;
  }

  std::string directory_;
};

TEST_F(SafetensorsTest, RoundTripIsBitExact) {
  const std::vector<named_tensor> tensors = awkward_tensors();
  std::string error;
  ASSERT_TRUE(write_safetensors(path("w.safetensors"), tensors, {{"step", "7"}}, &error)) << error;
  auto read = read_safetensors(path("w.safetensors"), &error);
  ASSERT_TRUE(read.has_value()) << error;
  ASSERT_EQ(read->size(), tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    EXPECT_EQ((*read)[t].name, tensors[t].name);
    EXPECT_EQ((*read)[t].dims, tensors[t].dims);
    ASSERT_EQ((*read)[t].values.size(), tensors[t].values.size());
    for (size_t i = 0; i < tensors[t].values.size(); ++i) {
      EXPECT_EQ(bits_of((*read)[t].values[i]), bits_of(tensors[t].values[i])) << tensors[t].name;
    }
  }
}

// Checks the written bytes against the format's rules with a reader of the test's own.
TEST_F(SafetensorsTest, WrittenFileFollowsTheFormat) {
  const std::vector<named_tensor> tensors = awkward_tensors();
  std::string error;
  ASSERT_TRUE(write_safetensors(path("w.safetensors"), tensors, {{"producer", "troupe"}}, &error));
  std::ifstream stream(path("w.safetensors"), std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(stream)),
                         std::istreambuf_iterator<char>());
  ASSERT_GE(file.size(), 8u);
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | uint8_t(file[i]);
  ASSERT_LE(8 + header_bytes, file.size());
  EXPECT_EQ((8 + header_bytes) % 8, 0u);
  const nlohmann::json header = nlohmann::json::parse(file.substr(8, header_bytes));
  ASSERT_TRUE(header.is_object());
  EXPECT_EQ(header["__metadata__"], nlohmann::json({{"producer", "troupe"}}));
  EXPECT_EQ(header.size(), tensors.size() + 1);
  const std::string data = file.substr(8 + header_bytes);
  uint64_t next = 0;  // the tensors are laid out in the order given, from 0, with no gaps
  for (const named_tensor& tensor : tensors) {
    const nlohmann::json& entry = header.at(tensor.name);
    EXPECT_EQ(entry.at("dtype"), "F32");
    EXPECT_EQ(entry.at("shape").get<std::vector<int64_t>>(), tensor.dims);
    const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_EQ(offsets[0], next) << tensor.name;
    EXPECT_EQ(offsets[1] - offsets[0], 4 * tensor.values.size());
    for (size_t i = 0; i < tensor.values.size(); ++i) {
      EXPECT_EQ(data.substr(offsets[0] + 4 * i, 4), little_endian(bits_of(tensor.values[i]), 4));
    }
    next = offsets[1];
  }
  EXPECT_EQ(next, data.size());  // and cover the data section exactly
}

TEST_F(SafetensorsTest, WriteRefusesRepeatedNamesAndValuesOffTheShape) {
  std::string error;
  EXPECT_FALSE(write_safetensors(path("w"), {{"a", {1}, {1}}, {"a", {1}, {2}}}, {}, &error));
  EXPECT_NE(error.find("\"a\""), std::string::npos) << error;
  EXPECT_FALSE(write_safetensors(path("w"), {{"b", {2}, {1}}}, {}, &error));
  EXPECT_NE(error.find("tensor b"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(path("w")));
}

TEST_F(SafetensorsTest, TruncatedDataIsRefused) {
  std::string error;
  ASSERT_TRUE(write_safetensors(path("w.safetensors"), awkward_tensors(), {}, &error));
  fs::resize_file(path("w.safetensors"), fs::file_size(path("w.safetensors")) - 4);
  EXPECT_NE(refusal(path("w.safetensors")).find("tensor cube"), std::string::npos);
}

TEST_F(SafetensorsTest, HeaderLengthPastTheEndIsRefused) {
  const std::string file = path("short.safetensors");
  std::ofstream(file, std::ios::binary) << little_endian(1000, 8) << "{}";
  EXPECT_NE(refusal(file).find("past the end"), std::string::npos);
  std::ofstream(file, std::ios::binary) << little_endian(~uint64_t{0}, 8) << "{}";
  EXPECT_NE(refusal(file).find("past the end"), std::string::npos);
  std::ofstream(file, std::ios::binary) << "abc";
  EXPECT_NE(refusal(file).find("3 bytes"), std::string::npos);
}

TEST_F(SafetensorsTest, OverlappingTensorsAreRefused) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  const std::string error = refusal(hand_made(header, std::string(12, '\0')));
  EXPECT_NE(error.find("tensor b [4, 12] overlaps tensor a"), std::string::npos) << error;
}

TEST_F(SafetensorsTest, HoleInTheDataIsRefused) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})";
  const std::string error = refusal(hand_made(header, std::string(20, '\0')));
  EXPECT_NE(error.find("tensor b [12, 20] leaves a hole of 4 bytes"), std::string::npos) << error;
}

TEST_F(SafetensorsTest, BytesAfterTheLastTensorAreRefused) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string error = refusal(hand_made(header, std::string(12, '\0')));
  EXPECT_NE(error.find("4 bytes belong to no tensor"), std::string::npos) << error;
}

TEST_F(SafetensorsTest, ByteCountOffTheShapeIsRefused) {
  const std::string header = R"({"weight":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  const std::string error = refusal(hand_made(header, std::string(16, '\0')));
  EXPECT_NE(error.find("tensor weight: its data_offsets [0,8] hold 8 bytes but shape [3] needs 12"),
            std::string::npos)
      << error;
}

TEST_F(SafetensorsTest, OtherDtypesAreRefusedByName) {
  const std::string header = R"({"half":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  const std::string error = refusal(hand_made(header, std::string(4, '\0')));
  EXPECT_NE(error.find("tensor half: it has dtype \"F16\"; troupe reads only F32"),
            std::string::npos)
      << error;
}

TEST_F(SafetensorsTest, MalformedHeadersAreRefused) {
  EXPECT_NE(refusal(hand_made("{\"a\": nope}", "")).find("not JSON"), std::string::npos);
  EXPECT_NE(refusal(hand_made("[1, 2]", "")).find("not a JSON object"), std::string::npos);
  const std::string negative = R"({"n":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})";
  EXPECT_NE(refusal(hand_made(negative, "")).find("tensor n: its shape"), std::string::npos);
  const std::string huge = R"({"h":{"dtype":"F32","shape":[65536,65536],"data_offsets":[0,4]}})";
  EXPECT_NE(refusal(hand_made(huge, std::string(4, '\0'))).find("tensor h"), std::string::npos);
  EXPECT_NE(refusal(hand_made(R"({"__metadata__":{"step":7}})", "")).find("__metadata__"),
            std::string::npos);
}

TEST_F(SafetensorsTest, AHeaderNestedAMillionLevelsDeepIsRefused) {
  // Copying or printing such a value recurses once per level and overflows the stack.
  const std::string deep = "{\"a\":" + std::string(1000000, '[') + std::string(1000000, ']') + "}";
  EXPECT_NE(refusal(hand_made(deep, "")).find("nested deeper than 64 levels"), std::string::npos);
}

TEST_F(SafetensorsTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = path("pipe.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(refusal(fifo).find("a FIFO, not a regular file"), std::string::npos);
}

TEST_F(SafetensorsTest, RepeatedTensorNamesAreRefused) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_NE(refusal(hand_made(header, std::string(8, '\0'))).find("names \"a\" twice"),
            std::string::npos);
}

/// Each stage's freshly initialized state, as a run's first checkpoint would hold it.
std::vector<stage_state> fresh_states(const job_config& config) {
  std::string error;
  auto ranges = partition_model(config, &error);
  auto backend = layers::create_backend("cpu", 1, &error);
  std::vector<stage_state> states;
  for (size_t i = 0; i < ranges->size(); ++i) {
    states.push_back(make_layers_stage_device(config, (*ranges)[i], *backend)->save_state());
    states.back().stage = static_cast<int32_t>(i);
  }
  return states;
}

/// The exported tensors of a two-stage job, with values no fresh model has.
std::vector<named_tensor> two_stage_export() {
  auto tensors = export_tensors(fresh_states(
      testing::small_pipeline_job(2, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64)));
  for (size_t t = 0; t < tensors.size(); ++t) {
    for (size_t i = 0; i < tensors[t].values.size(); ++i) tensors[t].values[i] = t + 0.001f * i;
  }
  return tensors;
}

TEST_F(SafetensorsTest, StageStatesTakeTheModelsNamesAndShapes) {
  const job_config config =
      testing::small_pipeline_job(2, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64);
  const std::vector<stage_state> fresh = fresh_states(config);
  const std::vector<named_tensor> tensors = two_stage_export();
  EXPECT_EQ(tensors.front().name, "stage0.linear0.weight");
  std::string error;
  auto states = stage_states_from_tensors(tensors, config, &error);
  ASSERT_TRUE(states.has_value()) << error;
  ASSERT_EQ(states->size(), 2u);
  size_t next = 0;
  for (size_t s = 0; s < states->size(); ++s) {
    const stage_state& state = (*states)[s];
    EXPECT_EQ(state.stage, static_cast<int32_t>(s));
    EXPECT_EQ(state.stages, 2);
    EXPECT_LT(state.first_block, state.last_block);
    EXPECT_TRUE(state.gradients.empty() && state.optimizer_state.empty());
    ASSERT_EQ(state.parameters.size(), fresh[s].parameters.size());
    for (size_t p = 0; p < state.parameters.size(); ++p, ++next) {
      EXPECT_EQ(state.parameters[p].name, fresh[s].parameters[p].name);
      EXPECT_EQ(state.parameters[p].dims, fresh[s].parameters[p].dims);
      EXPECT_EQ(state.parameters[p].values, tensors[next].values);
    }
  }
  EXPECT_EQ((*states)[0].last_block, (*states)[1].first_block);
}

TEST_F(SafetensorsTest, MissingTensorIsNamed) {
  std::vector<named_tensor> tensors = two_stage_export();
  const std::string name = tensors.back().name;  // stage1.linear7.bias
  tensors.pop_back();
  std::string error;
  EXPECT_FALSE(stage_states_from_tensors(
      tensors, testing::small_pipeline_job(2, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64),
      &error));
  EXPECT_EQ(error, "the file has no tensor " + name + " (nor linear7.bias)");
}

TEST_F(SafetensorsTest, WrongShapeIsNamed) {
  std::vector<named_tensor> tensors = two_stage_export();
  named_tensor& weight = tensors.front();
  const std::string model_shape = layers::to_string(weight.dims);
  std::swap(weight.dims[0], weight.dims[1]);
  std::string error;
  EXPECT_FALSE(stage_states_from_tensors(
      tensors, testing::small_pipeline_job(2, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64),
      &error));
  EXPECT_EQ(error, "tensor stage0.linear0.weight has shape " + layers::to_string(weight.dims) +
                       " but the model's is " + model_shape);
}

TEST_F(SafetensorsTest, ExtraTensorIsNamed) {
  std::vector<named_tensor> tensors = two_stage_export();
  tensors.push_back({"stage1.linear9.weight", {1}, {0}});
  std::string error;
  EXPECT_FALSE(stage_states_from_tensors(
      tensors, testing::small_pipeline_job(2, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64),
      &error));
  EXPECT_NE(error.find("stage1.linear9.weight"), std::string::npos) << error;
}

TEST_F(SafetensorsTest, AnotherStageCountLoadsWithOrWithoutStagePrefixes) {
  job_config one_stage =
      testing::small_pipeline_job(2, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64);
  one_stage.parallelism.stages = 1;
  std::vector<named_tensor> tensors = two_stage_export();
  std::vector<named_tensor> bare = tensors;
  for (named_tensor& tensor : bare) tensor.name = tensor.name.substr(tensor.name.find('.') + 1);
  for (const auto* file : {&tensors, &bare}) {
    std::string error;
    auto states = stage_states_from_tensors(*file, one_stage, &error);
    ASSERT_TRUE(states.has_value()) << error;
    ASSERT_EQ(states->size(), 1u);
    const std::vector<named_tensor>& parameters = (*states)[0].parameters;
    ASSERT_EQ(parameters.size(), tensors.size());
    for (size_t p = 0; p < parameters.size(); ++p) {
      EXPECT_EQ(bare[p].name, parameters[p].name);
      EXPECT_EQ(parameters[p].values, tensors[p].values);
    }
  }
}

TEST_F(SafetensorsTest, APartitionThatCutsALayerTakesEachPartsRowsOfTheWholeTensor) {
  // The 2-stage export (whole layers) into 3 stages that cut inside linear3 (20 outputs, at 8):
  // the same weights, the head's rows in stage 0 and the tail's in stage 1.
  job_config cut =
      testing::small_pipeline_job(3, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64);
  cut.parallelism.partition = "3:8,5";
  ASSERT_EQ(expand_cut_points(&cut), "");
  std::vector<named_tensor> tensors = two_stage_export();
  std::vector<named_tensor> bare = tensors;
  for (named_tensor& tensor : bare) tensor.name = tensor.name.substr(tensor.name.find('.') + 1);
  const auto whole = [&tensors](const std::string& name) {
    for (const named_tensor& tensor : tensors) {
      if (tensor.name.substr(tensor.name.find('.') + 1) == name) return tensor;
    }
    return named_tensor{};
  };
  for (const auto* file : {&tensors, &bare}) {
    std::string error;
    auto states = stage_states_from_tensors(*file, cut, &error);
    ASSERT_TRUE(states.has_value()) << error;
    ASSERT_EQ(states->size(), 3u);
    const named_tensor weight = whole("linear3.weight"), bias = whole("linear3.bias");
    ASSERT_EQ(weight.dims, (layers::shape{20, 24}));
    const auto& head = (*states)[0].parameters;
    const auto& tail = (*states)[1].parameters;
    ASSERT_EQ(head.size(), 4u);  // linear0's and linear3's first 8 rows
    EXPECT_EQ(head[2].name, "linear3.weight");
    EXPECT_EQ(head[2].dims, (layers::shape{8, 24}));
    EXPECT_EQ(head[2].values,
              std::vector<float>(weight.values.begin(), weight.values.begin() + 192));
    EXPECT_EQ(head[3].values, std::vector<float>(bias.values.begin(), bias.values.begin() + 8));
    EXPECT_EQ(tail[0].name, "linear3.weight");
    EXPECT_EQ(tail[0].dims, (layers::shape{12, 24}));
    EXPECT_EQ(tail[0].values, std::vector<float>(weight.values.begin() + 192, weight.values.end()));
    EXPECT_EQ(tail[1].values, std::vector<float>(bias.values.begin() + 8, bias.values.end()));
    ASSERT_EQ(tail.size(), 2u);
    EXPECT_EQ((*states)[2].parameters.at(0).values, whole("linear5.weight").values);
  }
  // A tensor of neither shape is refused by name.
  std::vector<named_tensor> odd = tensors;
  for (named_tensor& tensor : odd) {
    if (tensor.name == "stage0.linear3.weight") tensor.dims = {10, 48};
  }
  std::string error;
  EXPECT_FALSE(stage_states_from_tensors(odd, cut, &error));
  EXPECT_EQ(error, "tensor stage0.linear3.weight has shape [10, 48] but the model's is [8, 24]");
}

TEST_F(SafetensorsTest, InitialStageStatesLoadIntoTheStages) {
  job_config config =
      testing::small_pipeline_job(2, 1, pipeline_mode::sync, pipeline_schedule::gpipe, 64);
  config.model.init_from = path("init.safetensors");
  std::string error;
  ASSERT_TRUE(write_safetensors(config.model.init_from, two_stage_export(), {}, &error)) << error;
  auto states = initial_stage_states(config, &error);
  ASSERT_TRUE(states.has_value()) << error;
  auto ranges = partition_model(config, &error);
  auto backend = layers::create_backend("cpu", 1, &error);
  for (size_t s = 0; s < states->size(); ++s) {
    auto device = make_layers_stage_device(config, (*ranges)[s], *backend);
    ASSERT_TRUE(device->load_state((*states)[s], true, &error)) << error;
    EXPECT_EQ(device->save_state().parameters[0].values, (*states)[s].parameters[0].values);
  }
  config.model.init_from = path("absent.safetensors");
  EXPECT_FALSE(initial_stage_states(config, &error));
  EXPECT_EQ(error.rfind("model.init_from: " + config.model.init_from + ": ", 0), 0u) << error;
}

}  // namespace
}  // namespace troupe::actors
