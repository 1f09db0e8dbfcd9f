#include "actors/storage/checkpoint_manifest.h"

#include <algorithm>
#include <limits>
#include <type_traits>

namespace troupe::actors {
namespace {

using nlohmann::json;

/// Sets `error` to `message`; false.
bool refuse(std::string* error, std::string message) {
  *error = std::move(message);
  return false;
}

// Manifest fields. Each reader names the field (with its place, "shards[1].bytes") on failure.

bool bad_field(const std::string& name, const char* kind, std::string* error) {
  return refuse(error, "manifest field '" + name + "' is missing or not " + kind);
}

const json* field(const json& object, const char* key) {
  const auto found = object.find(key);
  return found == object.end() ? nullptr : &*found;
}

bool read_string(const json& object, const std::string& place, const char* key, std::string* out,
                 std::string* error) {
  const json* value = field(object, key);
  if (value == nullptr || !value->is_string()) return bad_field(place + key, "a string", error);
  *out = value->get<std::string>();
  return true;
}

template <typename integer>
bool read_integer(const json& object, const std::string& place, const char* key, integer* out,
                  std::string* error) {
  const json* value = field(object, key);
  bool fits = value != nullptr && value->is_number_integer();
  if (fits && value->is_number_unsigned()) {
    fits = value->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<integer>::max());
  } else if (fits) {
    const int64_t number = value->get<int64_t>();
    fits = number >= static_cast<int64_t>(std::numeric_limits<integer>::min()) &&
           static_cast<uint64_t>(std::max<int64_t>(number, 0)) <=
               static_cast<uint64_t>(std::numeric_limits<integer>::max());
  }
  if (!fits) {
    const char* kind = std::is_signed_v<integer> ? "an integer" : "an unsigned integer";
    return bad_field(place + key, kind, error);
  }
  *out = value->is_number_unsigned() ? static_cast<integer>(value->get<uint64_t>())
                                     : static_cast<integer>(value->get<int64_t>());
  return true;
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find("..") == std::string::npos && name.find('\0') == std::string::npos;
}

bool is_xxh3_hex(const std::string& text) {
  return text.size() == 16 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool read_shard_entry(const json& value, size_t index, shard_entry* entry, std::string* error) {
  const std::string place = "shards[" + std::to_string(index) + "].";
  if (!value.is_object()) return bad_field(place.substr(0, place.size() - 1), "an object", error);
  if (!read_integer(value, place, "stage", &entry->stage, error) ||
      !read_string(value, place, "file", &entry->file, error) ||
      !read_integer(value, place, "bytes", &entry->bytes, error) ||
      !read_string(value, place, "xxh3", &entry->xxh3, error)) {
    return false;
  }
  if (entry->stage != static_cast<int32_t>(index)) {
    return refuse(error, "manifest field '" + place + "stage' is " + std::to_string(entry->stage) +
                             "; shards are listed in stage order");
  }
  if (!is_plain_file_name(entry->file)) {
    return refuse(error, "manifest field '" + place + "file' (\"" + entry->file +
                             "\") is not a file name inside the checkpoint directory");
  }
  if (!is_xxh3_hex(entry->xxh3)) {
    return refuse(error, "manifest field '" + place + "xxh3' is not 16 lowercase hex digits");
  }
  return true;
}

bool check_manifest_numbers(const checkpoint_manifest& manifest, std::string* error) {
  if (manifest.format != 1) {
    return refuse(error, "manifest format " + std::to_string(manifest.format) +
                             " is not one this build reads (1)");
  }
  if (manifest.step < 0) return refuse(error, "manifest field 'step' is negative");
  if (manifest.epoch < 0) return refuse(error, "manifest field 'epoch' is negative");
  if (manifest.stages < 1) return refuse(error, "manifest field 'stages' is less than 1");
  return true;
}

bool read_shard_entries(const json& object, checkpoint_manifest* manifest, std::string* error) {
  const json* shards = field(object, "shards");
  if (shards == nullptr || !shards->is_array()) return bad_field("shards", "an array", error);
  if (shards->size() != static_cast<size_t>(manifest->stages)) {
    return refuse(error, "manifest field 'shards' lists " + std::to_string(shards->size()) +
                             " shards for " + std::to_string(manifest->stages) + " stages");
  }
  manifest->shards.resize(shards->size());
  for (size_t i = 0; i < shards->size(); ++i) {
    if (!read_shard_entry((*shards)[i], i, &manifest->shards[i], error)) return false;
  }
  return true;
}

}  // namespace

json to_json(const checkpoint_manifest& manifest) {
  json shards = json::array();
  for (const shard_entry& entry : manifest.shards) {
    shards.push_back({{"stage", entry.stage},
                      {"file", entry.file},
                      {"bytes", entry.bytes},
                      {"xxh3", entry.xxh3}});
  }
  return {{"format", manifest.format},
          {"job", manifest.job},
          {"config_hash", manifest.config_hash},
          {"step", manifest.step},
          {"epoch", manifest.epoch},
          {"stages", manifest.stages},
          {"coordinator", manifest.coordinator},
          {"shards", shards},
          {"created_unix_s", manifest.created_unix_s}};
}

std::optional<checkpoint_manifest> manifest_from_json(const json& value, std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  if (!value.is_object()) {
    refuse(error, "the manifest is not a JSON object");
    return std::nullopt;
  }
  checkpoint_manifest manifest;
  const json* coordinator = field(value, "coordinator");
  const json* created = field(value, "created_unix_s");
  if (!read_integer(value, "", "format", &manifest.format, error) ||
      !read_string(value, "", "job", &manifest.job, error) ||
      !read_string(value, "", "config_hash", &manifest.config_hash, error) ||
      !read_integer(value, "", "step", &manifest.step, error) ||
      !read_integer(value, "", "epoch", &manifest.epoch, error) ||
      !read_integer(value, "", "stages", &manifest.stages, error) ||
      !check_manifest_numbers(manifest, error)) {
    return std::nullopt;
  }
  if (coordinator == nullptr || !coordinator->is_object()) {
    bad_field("coordinator", "an object", error);
    return std::nullopt;
  }
  if (created == nullptr || !created->is_number()) {
    bad_field("created_unix_s", "a number", error);
    return std::nullopt;
  }
  if (!read_shard_entries(value, &manifest, error)) return std::nullopt;
  manifest.coordinator = *coordinator;
  manifest.created_unix_s = created->get<double>();
  return manifest;
}

}  // namespace troupe::actors
