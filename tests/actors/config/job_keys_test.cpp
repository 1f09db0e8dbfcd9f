#include "actors/config/job_keys.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "actors/config/job_file.h"
#include "layers/layer_registry.h"

namespace troupe::actors {
namespace {

/// "section.key" → its description, over every section.
std::vector<std::pair<std::string, key_description>> every_key() {
  std::vector<std::pair<std::string, key_description>> keys;
  for (const section_description& section : job_file_keys()) {
    for (const key_description& key : section.keys)
      keys.emplace_back(section.name + "." + key.name, key);
  }
  return keys;
}

const key_description& key_named(const std::string& name) {
  static const auto keys = every_key();
  const auto found =
      std::find_if(keys.begin(), keys.end(), [&](const auto& k) { return k.first == name; });
  EXPECT_NE(found, keys.end()) << name;
  return found->second;
}

TEST(JobKeysTest, EveryKeyHasADescriptionOfOneLine) {
  const auto keys = every_key();
  ASSERT_GT(keys.size(), 50u);
  for (const auto& [name, key] : keys) {
    EXPECT_FALSE(key.description.empty()) << name;
    EXPECT_EQ(key.description.find('\n'), std::string::npos) << name;
    EXPECT_EQ(key.required, key.default_value.empty()) << name;
  }
}

TEST(JobKeysTest, EveryLayerTypeAndLayerKeyHasADescription) {
  const std::vector<layer_type_description> types = layer_type_keys();
  ASSERT_EQ(types.size(), layers::layer_type_names().size());
  const std::vector<std::string>& built_in = layers::built_in_layer_types();
  for (const layer_type_description& type : types) {
    // A type that a test of this process registered has no description of its own.
    const bool is_built_in = std::count(built_in.begin(), built_in.end(), type.type) > 0;
    EXPECT_EQ(type.description.empty(), !is_built_in) << type.type;
    for (const key_description& key : type.keys) {
      EXPECT_FALSE(key.description.empty()) << type.type << "." << key.name;
    }
  }
}

TEST(JobKeysTest, EveryNodeKeyIsDescribed) {
  std::vector<std::string> names;
  for (const key_description& key : graph_node_keys()) {
    names.push_back(key.name);
    EXPECT_FALSE(key.description.empty()) << key.name;
    EXPECT_EQ(key.required, key.default_value.empty()) << key.name;
    if (key.name == "route") {
      EXPECT_EQ(key.values, (std::vector<std::string>{"chain", "loop", "tree"}));
      EXPECT_EQ(key.default_value, "\"chain\"");
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"name", "layers", "route", "emit", "next"}));
}

TEST(JobKeysTest, TheSectionsAndKeysAreThoseOfConfigJson) {
  // A chain job's config.json, a graph job's on listops data and a padded one's on records hold
  // every key between them.
  const std::optional<job_config> chain =
      parse_job("[model]\nlayers = [{ type = \"linear\", out = 10 }]\n", "job.toml", {}, nullptr);
  const std::string node = "[[model.nodes]]\nname = \"a\"\nlayers = [{ type = \"relu\" }]\n";
  const std::optional<job_config> graph =
      parse_job("[data]\ndataset = \"listops\"\n" + node, "job.toml", {}, nullptr);
  const std::optional<job_config> padded =
      parse_job("[data]\ndataset = \"text-records\"\npadding = \"longest\"\n" + node, "job.toml",
                {}, nullptr);
  ASSERT_TRUE(chain.has_value());
  ASSERT_TRUE(graph.has_value());
  ASSERT_TRUE(padded.has_value());
  std::set<std::string> written, described;
  for (const nlohmann::json& json : {to_json(*chain), to_json(*graph), to_json(*padded)}) {
    for (const auto& [section, keys] : json.items()) {
      for (const auto& [key, value] : keys.items()) written.insert(section + "." + key);
    }
  }
  for (const auto& [name, key] : every_key()) described.insert(name);
  EXPECT_EQ(described, written);
}

TEST(JobKeysTest, DefaultsComeFromADefaultJobConfig) {
  EXPECT_EQ(key_named("parallelism.stages").default_value,
            std::to_string(job_config().parallelism.stages));
  EXPECT_EQ(key_named("parallelism.mode").default_value,
            std::string("\"") + to_string(job_config().parallelism.mode) + "\"");
  EXPECT_EQ(key_named("model.input_shape").default_value, "[1, 28, 28]");
  EXPECT_EQ(key_named("parallelism.max_active_keys").default_meaning, "the number of stages");
  EXPECT_EQ(key_named("model.layers").default_meaning,
            "required unless the model is a graph, model.nodes");
  EXPECT_FALSE(key_named("model.nodes").required);
}

TEST(JobKeysTest, ClosedSetsListTheirValuesAndIncludeTheirDefault) {
  for (const auto& [name, key] : every_key()) {
    if (key.values.empty()) continue;
    const std::string unquoted = key.default_value.substr(1, key.default_value.size() - 2);
    EXPECT_NE(std::find(key.values.begin(), key.values.end(), unquoted), key.values.end()) << name;
  }
  EXPECT_EQ(key_named("parallelism.schedule").values,
            (std::vector<std::string>{"gpipe", "1f1b", "zb-h1", "interleaved"}));
}

TEST(JobKeysTest, TuningKeysAreMarkedExpert) {
  for (const char* name : {"parallelism.spin_wait_ms", "parallelism.threads",
                           "parallelism.correction_warmup_steps", "parallelism.collective"}) {
    EXPECT_TRUE(key_named(name).expert) << name;
  }
  for (const char* name : {"parallelism.stages", "parallelism.mode", "training.lr"}) {
    EXPECT_FALSE(key_named(name).expert) << name;
  }
}

}  // namespace
}  // namespace troupe::actors
