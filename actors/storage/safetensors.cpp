#include "actors/storage/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "actors/config/json_text.h"
#include "layers/regular_file.h"
#include "layers/tensor.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

/// The format's own limit (safetensors' MAX_HEADER_SIZE), so that a length field cannot make a
/// reader allocate gigabytes before it has seen a byte of JSON.
constexpr uint64_t max_header_bytes = 100'000'000;
constexpr char metadata_key[] = "__metadata__";

bool host_is_little_endian() {
  const uint32_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

void swap_float_bytes(float* values, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    unsigned char bytes[sizeof(float)];
    std::memcpy(bytes, &values[i], sizeof bytes);
    std::reverse(bytes, bytes + sizeof bytes);
    std::memcpy(&values[i], bytes, sizeof bytes);
  }
}

// ---- Writing ----

bool check_writable(const std::vector<named_tensor>& tensors, std::string* error) {
  std::set<std::string> names;
  for (const named_tensor& tensor : tensors) {
    if (tensor.name.empty() || tensor.name == metadata_key || !names.insert(tensor.name).second) {
      *error = "tensor name \"" + tensor.name + "\" is empty, reserved or repeated";
      return false;
    }
    const bool negative =
        std::any_of(tensor.dims.begin(), tensor.dims.end(), [](int64_t dim) { return dim < 0; });
    if (negative ||
        static_cast<int64_t>(tensor.values.size()) != layers::element_count(tensor.dims)) {
      *error = "tensor " + tensor.name + " holds " + std::to_string(tensor.values.size()) +
               " values for shape " + layers::to_string(tensor.dims);
      return false;
    }
  }
  return true;
}

/// The JSON header, padded with spaces so that the data starts 8-byte aligned.
std::string header_text(const std::vector<named_tensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[metadata_key] = metadata;
  uint64_t offset = 0;
  for (const named_tensor& tensor : tensors) {
    const uint64_t end = offset + tensor.values.size() * sizeof(float);
    header[tensor.name] = {
        {"dtype", "F32"}, {"shape", tensor.dims}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

std::string little_endian_u64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

// ---- Reading ----

/// One header entry, checked against the data section but not yet read.
struct tensor_entry {
  std::string name;
  std::vector<int64_t> dims;
  uint64_t begin = 0;
  uint64_t end = 0;
};

/// Parses the header, noting the first key that an object repeats: nlohmann keeps the last
/// value silently, and two tensors of one name would make the file mean two things.
std::optional<nlohmann::json> parse_header(const std::string& text, std::string* repeated,
                                           std::string* error) {
  const std::string out_of_bounds = json_limits_problem(text);
  if (!out_of_bounds.empty()) {
    *error = "the header is " + out_of_bounds;
    return std::nullopt;
  }
  std::vector<std::set<std::string>> open_objects;
  auto note_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using event_kind = nlohmann::json::parse_event_t;
    if (event == event_kind::object_start) open_objects.emplace_back();
    if (event == event_kind::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == event_kind::key && !open_objects.empty() && repeated->empty() &&
        !open_objects.back().insert(parsed.get<std::string>()).second) {
      *repeated = parsed.get<std::string>();
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, note_keys);
  } catch (const nlohmann::json::exception& problem) {
    const std::string what = problem.what();
    const size_t start = what.find("] ");
    *error = "the header is not JSON: " + what.substr(start == std::string::npos ? 0 : start + 2);
    return std::nullopt;
  }
}

bool unsigned_integer(const nlohmann::json& value) { return value.is_number_unsigned(); }

/// Checks the shape and returns its element count, at most `limit` (the data section's floats).
bool read_shape(const nlohmann::json& shape, uint64_t limit, tensor_entry* entry,
                uint64_t* elements, std::string* error) {
  if (!shape.is_array() || !std::all_of(shape.begin(), shape.end(), unsigned_integer)) {
    *error = "its shape is not a list of non-negative integers: " + shape.dump();
    return false;
  }
  bool empty = false;
  for (const nlohmann::json& dim : shape) empty = empty || dim.get<uint64_t>() == 0;
  *elements = empty ? 0 : 1;
  for (const nlohmann::json& dim : shape) {
    const uint64_t size = dim.get<uint64_t>();
    if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      *error = "its shape " + shape.dump() + " has a dimension too large for troupe";
      return false;
    }
    if (!empty && *elements > limit / size) {
      *error = "its shape " + shape.dump() + " needs more bytes than the data section holds";
      return false;
    }
    if (!empty) *elements *= size;
    entry->dims.push_back(static_cast<int64_t>(size));
  }
  return true;
}

bool read_entry(const nlohmann::json& value, uint64_t data_bytes, tensor_entry* entry,
                std::string* error) {
  if (!value.is_object()) {
    *error = "its entry is not an object";
    return false;
  }
  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string() || *dtype != "F32") {
    *error = "it has dtype " + (dtype == value.end() ? std::string("(none)") : dtype->dump()) +
             "; troupe reads only F32";
    return false;
  }
  const auto shape = value.find("shape");
  uint64_t elements = 0;
  if (shape == value.end() ||
      !read_shape(*shape, data_bytes / sizeof(float), entry, &elements, error)) {
    if (shape == value.end()) *error = "it has no shape";
    return false;
  }
  const auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
      !unsigned_integer((*offsets)[0]) || !unsigned_integer((*offsets)[1])) {
    *error = "its data_offsets are not a pair of non-negative integers";
    return false;
  }
  entry->begin = (*offsets)[0].get<uint64_t>();
  entry->end = (*offsets)[1].get<uint64_t>();
  if (entry->begin > entry->end || entry->end > data_bytes) {
    *error = "its data_offsets " + offsets->dump() + " do not lie within the data section of " +
             std::to_string(data_bytes) + " bytes (is the file truncated?)";
    return false;
  }
  if (entry->end - entry->begin != elements * sizeof(float)) {
    *error = "its data_offsets " + offsets->dump() + " hold " +
             std::to_string(entry->end - entry->begin) + " bytes but shape " + shape->dump() +
             " needs " + std::to_string(elements * sizeof(float));
    return false;
  }
  return true;
}

bool check_metadata(const nlohmann::json& metadata, std::string* error) {
  const bool strings = metadata.is_object() &&
                       std::all_of(metadata.begin(), metadata.end(),
                                   [](const nlohmann::json& value) { return value.is_string(); });
  if (!strings) *error = "__metadata__ is not an object of strings";
  return strings;
}

/// The format's layout rule: sorted by offset, the tensors tile the data section exactly.
bool check_tiling(std::vector<tensor_entry>& entries, uint64_t data_bytes, std::string* error) {
  std::sort(entries.begin(), entries.end(), [](const tensor_entry& a, const tensor_entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const tensor_entry& entry = entries[i];
    const std::string range =
        " [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "]";
    if (entry.begin < covered) {
      *error = "tensor " + entry.name + range + " overlaps tensor " + entries[i - 1].name;
      return false;
    }
    if (entry.begin > covered) {
      *error = "tensor " + entry.name + range + " leaves a hole of " +
               std::to_string(entry.begin - covered) + " bytes before it in the data section";
      return false;
    }
    covered = entry.end;
  }
  if (covered != data_bytes) {
    *error = "the data section has " + std::to_string(data_bytes) +
             " bytes but its tensors cover " + std::to_string(covered) + " (" +
             std::to_string(data_bytes - covered) + " bytes belong to no tensor)";
    return false;
  }
  return true;
}

/// The header's tensors, checked one by one and then as a layout.
std::optional<std::vector<tensor_entry>> read_entries(const nlohmann::json& header,
                                                      uint64_t data_bytes, std::string* error) {
  std::vector<tensor_entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == metadata_key) {
      if (!check_metadata(value, error)) return std::nullopt;
      continue;
    }
    tensor_entry entry;
    entry.name = name;
    std::string problem;
    if (!read_entry(value, data_bytes, &entry, &problem)) {
      *error = "tensor " + name + ": " + problem;
      return std::nullopt;
    }
    entries.push_back(std::move(entry));
  }
  if (!check_tiling(entries, data_bytes, error)) return std::nullopt;
  return entries;
}

uint64_t from_little_endian(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

/// Reads and checks everything before the data; `data_start` is where it begins in the file.
std::optional<std::vector<tensor_entry>> read_layout(std::ifstream& file, uint64_t file_bytes,
                                                     uint64_t* data_start, std::string* error) {
  if (file_bytes < 8) {
    *error = "the file has " + std::to_string(file_bytes) +
             " bytes, too few for a safetensors header length";
    return std::nullopt;
  }
  unsigned char length_bytes[8];
  file.read(reinterpret_cast<char*>(length_bytes), sizeof length_bytes);
  const uint64_t header_bytes = from_little_endian(length_bytes);
  if (header_bytes > file_bytes - 8) {
    *error = "the header length " + std::to_string(header_bytes) + " runs past the end of the " +
             std::to_string(file_bytes) + "-byte file";
    return std::nullopt;
  }
  if (header_bytes > max_header_bytes) {
    *error = "the header length " + std::to_string(header_bytes) +
             " exceeds the format's limit of 100 MB";
    return std::nullopt;
  }
  std::string text(header_bytes, '\0');
  if (!file.read(text.data(), static_cast<std::streamsize>(header_bytes))) {
    *error = "the file ends inside its header";
    return std::nullopt;
  }
  std::string repeated;
  const std::optional<nlohmann::json> header = parse_header(text, &repeated, error);
  if (!header) return std::nullopt;
  if (!header->is_object()) {
    *error = "the header is " + std::string(header->type_name()) + ", not a JSON object";
    return std::nullopt;
  }
  if (!repeated.empty()) {
    *error = "the header names \"" + repeated + "\" twice";
    return std::nullopt;
  }
  *data_start = 8 + header_bytes;
  return read_entries(*header, file_bytes - *data_start, error);
}

}  // namespace

bool write_safetensors(const std::string& path, const std::vector<named_tensor>& tensors,
                       const std::map<std::string, std::string>& metadata, std::string* error,
                       file_system& files) {
  std::string problem;
  if (!check_writable(tensors, &problem)) {
    *error = path + ": " + problem;
    return false;
  }
  std::string header;
  try {
    header = header_text(tensors, metadata);
  } catch (const nlohmann::json::exception&) {
    *error = path + ": a tensor name or metadata string is not valid UTF-8";
    return false;
  }
  // The tensors' bytes go to the file as they are (little-endian hosts) or swapped into a
  // copy, one piece each: no second copy of a large model in memory.
  const std::string length = little_endian_u64(header.size());
  std::vector<std::string_view> pieces = {length, header};
  std::vector<std::vector<float>> swapped;
  if (!host_is_little_endian()) swapped.reserve(tensors.size());
  for (const named_tensor& tensor : tensors) {
    const std::vector<float>* values = &tensor.values;
    if (!host_is_little_endian()) {
      values = &swapped.emplace_back(tensor.values);
      swap_float_bytes(swapped.back().data(), swapped.back().size());
    }
    pieces.emplace_back(reinterpret_cast<const char*>(values->data()),
                        values->size() * sizeof(float));
  }
  return files.write_atomically(path, pieces, error);
}

std::optional<std::vector<named_tensor>> read_safetensors(const std::string& path,
                                                          std::string* error) {
  const std::string not_regular = layers::regular_file_problem(path);
  if (!not_regular.empty()) {
    *error = not_regular;
    return std::nullopt;
  }
  std::error_code code;
  const uint64_t file_bytes = fs::file_size(path, code);
  std::ifstream file(path, std::ios::binary);
  if (code || !file) {
    *error = path + ": cannot read: " + (code ? code.message() : std::strerror(errno));
    return std::nullopt;
  }
  std::string problem;
  uint64_t data_start = 0;
  auto entries = read_layout(file, file_bytes, &data_start, &problem);
  if (!entries) {
    *error = path + ": " + problem;
    return std::nullopt;
  }
  std::vector<named_tensor> tensors;
  tensors.reserve(entries->size());
  for (tensor_entry& entry : *entries) {
    named_tensor tensor{std::move(entry.name), std::move(entry.dims), {}};
    tensor.values.resize((entry.end - entry.begin) / sizeof(float));
    file.seekg(static_cast<std::streamoff>(data_start + entry.begin));
    if (!file.read(reinterpret_cast<char*>(tensor.values.data()),
                   static_cast<std::streamsize>(entry.end - entry.begin))) {
      *error = path + ": the file ends inside tensor " + tensor.name;
      return std::nullopt;
    }
    if (!host_is_little_endian()) swap_float_bytes(tensor.values.data(), tensor.values.size());
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

}  // namespace troupe::actors
