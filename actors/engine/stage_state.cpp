#include "actors/engine/stage_state.h"

#include <cereal/archives/portable_binary.hpp>
#include <cstring>
#include <exception>
#include <istream>
#include <streambuf>
#include <utility>

namespace troupe::actors {
namespace {

constexpr char shard_magic[8] = {'T', 'R', 'P', 'S', 'H', 'A', 'R', 'D'};
constexpr uint32_t shard_format = 1;
constexpr uint64_t max_dims = 8;
constexpr uint64_t max_name_bytes = 4096;

// A streambuf that reads caller-owned bytes in place.
class byte_reader : public std::streambuf {
 public:
  byte_reader(const void* data, size_t bytes) {
    char* begin = static_cast<char*>(const_cast<void*>(data));
    setg(begin, begin, begin + bytes);
  }
  uint64_t remaining() const { return static_cast<uint64_t>(egptr() - gptr()); }
};

// A streambuf that appends to a string reserved up front, so a shard of gigabytes is written
// once instead of growing a stream buffer and copying it out.
class string_writer : public std::streambuf {
 public:
  explicit string_writer(size_t reserve) { bytes_.reserve(reserve); }
  std::string take() { return std::move(bytes_); }

 protected:
  std::streamsize xsputn(const char* data, std::streamsize count) override {
    bytes_.append(data, static_cast<size_t>(count));
    return count;
  }
  int_type overflow(int_type c) override {
    if (c != traits_type::eof()) bytes_.push_back(static_cast<char>(c));
    return traits_type::not_eof(c);
  }

 private:
  std::string bytes_;
};

struct shard_error : std::exception {
  explicit shard_error(std::string text) : text(std::move(text)) {}
  const char* what() const noexcept override { return text.c_str(); }
  std::string text;
};

void write_tensors(cereal::PortableBinaryOutputArchive& archive,
                   const std::vector<named_tensor>& tensors) {
  archive(static_cast<uint64_t>(tensors.size()));
  for (const named_tensor& tensor : tensors) {
    archive(static_cast<uint64_t>(tensor.name.size()));
    archive(cereal::binary_data(tensor.name.data(), tensor.name.size()));
    archive(static_cast<uint64_t>(tensor.dims.size()));
    for (int64_t dim : tensor.dims) archive(dim);
    archive(static_cast<uint64_t>(tensor.values.size()));
    archive(cereal::binary_data(tensor.values.data(), tensor.values.size() * sizeof(float)));
  }
}

/// Reads a count and checks that `unit` bytes per item can still be there.
uint64_t read_count(cereal::PortableBinaryInputArchive& archive, const byte_reader& reader,
                    uint64_t unit, const char* what) {
  uint64_t count = 0;
  archive(count);
  if (unit > 0 && count > reader.remaining() / unit) {
    throw shard_error(std::string("the shard announces ") + std::to_string(count) + " " + what +
                      " but only " + std::to_string(reader.remaining()) + " bytes follow");
  }
  return count;
}

std::vector<named_tensor> read_tensors(cereal::PortableBinaryInputArchive& archive,
                                       const byte_reader& reader, const char* section) {
  std::vector<named_tensor> tensors(read_count(archive, reader, 24, section));
  for (named_tensor& tensor : tensors) {
    const uint64_t name_bytes = read_count(archive, reader, 1, "name bytes");
    if (name_bytes > max_name_bytes) throw shard_error("a tensor name is too long");
    tensor.name.resize(name_bytes);
    archive(cereal::binary_data(tensor.name.data(), name_bytes));
    const uint64_t dims = read_count(archive, reader, 8, "dimensions");
    if (dims > max_dims) throw shard_error("tensor " + tensor.name + " has too many dimensions");
    tensor.dims.resize(dims);
    uint64_t elements = 1;
    for (int64_t& dim : tensor.dims) {
      archive(dim);
      if (dim < 0 || (dim > 0 && elements > (uint64_t{1} << 40) / static_cast<uint64_t>(dim))) {
        throw shard_error("tensor " + tensor.name + " has an impossible shape");
      }
      elements *= static_cast<uint64_t>(dim);
    }
    const uint64_t values = read_count(archive, reader, sizeof(float), "values");
    if (values != elements) {
      throw shard_error("tensor " + tensor.name + " holds " + std::to_string(values) +
                        " values for a shape of " + std::to_string(elements));
    }
    tensor.values.resize(values);
    archive(cereal::binary_data(tensor.values.data(), values * sizeof(float)));
  }
  return tensors;
}

}  // namespace

std::string serialize_stage_state(const stage_state& state) {
  string_writer writer(static_cast<size_t>(stage_state_values(state)) * sizeof(float) + 4096);
  std::ostream stream(&writer);
  {
    cereal::PortableBinaryOutputArchive archive(stream);
    archive(cereal::binary_data(shard_magic, sizeof shard_magic), shard_format);
    archive(state.stage, state.stages, state.first_block, state.last_block, state.weight_version,
            state.keys_since_step, state.optimizer_steps, state.seed);
    write_tensors(archive, state.parameters);
    write_tensors(archive, state.gradients);
    write_tensors(archive, state.optimizer_state);
  }
  return writer.take();
}

namespace {

/// Reads the magic, the format and the counters; throws shard_error or cereal's exception.
void read_counters(cereal::PortableBinaryInputArchive& archive, stage_state* state) {
  char magic[sizeof shard_magic] = {};
  uint32_t format = 0;
  archive(cereal::binary_data(magic, sizeof magic), format);
  if (std::memcmp(magic, shard_magic, sizeof magic) != 0) {
    throw shard_error("not a troupe stage shard (bad magic)");
  }
  if (format != shard_format) {
    throw shard_error("shard format " + std::to_string(format) + " (this build reads " +
                      std::to_string(shard_format) + ")");
  }
  archive(state->stage, state->stages, state->first_block, state->last_block, state->weight_version,
          state->keys_since_step, state->optimizer_steps, state->seed);
}

/// Why the counters of a parsed shard cannot be a stage's (a checksum that verifies says only
/// that the bytes are the ones written, not that a troupe wrote them); "" when they can.
std::string counters_problem(const stage_state& state) {
  if (state.stages < 1 || state.stage < 0 || state.stage >= state.stages) {
    return "the shard names stage " + std::to_string(state.stage) + " of " +
           std::to_string(state.stages);
  }
  const std::pair<const char*, int64_t> counters[] = {{"weight_version", state.weight_version},
                                                      {"keys_since_step", state.keys_since_step},
                                                      {"optimizer_steps", state.optimizer_steps},
                                                      {"first_block", state.first_block}};
  for (const auto& [name, value] : counters) {
    if (value < 0)
      return std::string("the shard's ") + name + " is negative (" + std::to_string(value) + ")";
  }
  if (state.last_block < state.first_block) {
    return "the shard's blocks end (" + std::to_string(state.last_block) + ") before they begin (" +
           std::to_string(state.first_block) + ")";
  }
  return "";
}

std::optional<stage_state> parse_shard(const void* data, size_t bytes, bool with_tensors,
                                       std::string* error) {
  byte_reader reader(data, bytes);
  std::istream stream(&reader);
  stage_state state;
  try {
    cereal::PortableBinaryInputArchive archive(stream);
    read_counters(archive, &state);
    if (with_tensors) {
      state.parameters = read_tensors(archive, reader, "parameters");
      state.gradients = read_tensors(archive, reader, "gradients");
      state.optimizer_state = read_tensors(archive, reader, "optimizer tensors");
      if (reader.remaining() != 0) {
        throw shard_error(std::to_string(reader.remaining()) + " stray bytes after the shard");
      }
    }
  } catch (const shard_error& problem) {
    *error = problem.text;
    return std::nullopt;
  } catch (const std::exception&) {
    *error = "the shard ends early (truncated)";
    return std::nullopt;
  }
  const std::string problem = counters_problem(state);
  if (!problem.empty()) {
    *error = problem;
    return std::nullopt;
  }
  return state;
}

}  // namespace

std::optional<stage_state> parse_stage_state(const void* data, size_t bytes, std::string* error) {
  return parse_shard(data, bytes, /*with_tensors=*/true, error);
}

std::optional<stage_state> parse_stage_state_counters(const void* data, size_t bytes,
                                                      std::string* error) {
  return parse_shard(data, bytes, /*with_tensors=*/false, error);
}

int64_t stage_state_values(const stage_state& state) {
  int64_t values = 0;
  for (const auto* group : {&state.parameters, &state.gradients, &state.optimizer_state}) {
    for (const named_tensor& tensor : *group) values += static_cast<int64_t>(tensor.values.size());
  }
  return values;
}

/// Adds `from`'s tensors to `into`'s; false when their names or shapes differ.
static bool add_tensors(std::vector<named_tensor>* into, const std::vector<named_tensor>& from) {
  if (into->size() != from.size()) return false;
  for (size_t i = 0; i < from.size(); ++i) {
    named_tensor& target = (*into)[i];
    if (target.name != from[i].name || target.dims != from[i].dims ||
        target.values.size() != from[i].values.size()) {
      return false;
    }
    for (size_t j = 0; j < target.values.size(); ++j) target.values[j] += from[i].values[j];
  }
  return true;
}

static void scale_tensors(std::vector<named_tensor>* tensors, float factor) {
  for (named_tensor& tensor : *tensors) {
    for (float& value : tensor.values) value *= factor;
  }
}

std::vector<std::string> merge_replica_states(std::vector<std::string> shards, int stages,
                                              std::string* error) {
  if (stages < 1 || shards.size() % static_cast<size_t>(stages) != 0) {
    *error = std::to_string(shards.size()) + " shards for " + std::to_string(stages) + " stages";
    return {};
  }
  const size_t replicas = shards.size() / static_cast<size_t>(stages);
  std::vector<std::string> merged;
  for (size_t s = 0; s < static_cast<size_t>(stages); ++s) {
    bool equal = true;
    for (size_t r = 1; r < replicas; ++r) equal = equal && shards[r * stages + s] == shards[s];
    if (equal) {
      merged.push_back(std::move(shards[s]));
      continue;
    }
    std::optional<stage_state> mean = parse_stage_state(shards[s].data(), shards[s].size(), error);
    if (!mean) return {};
    for (size_t r = 1; r < replicas; ++r) {
      const std::string& bytes = shards[r * stages + s];
      std::optional<stage_state> other = parse_stage_state(bytes.data(), bytes.size(), error);
      if (!other) return {};
      if (!add_tensors(&mean->parameters, other->parameters) ||
          !add_tensors(&mean->optimizer_state, other->optimizer_state)) {
        *error = "the replicas of stage " + std::to_string(s) + " hold tensors of other shapes";
        return {};
      }
    }
    const float factor = 1.0f / static_cast<float>(replicas);
    scale_tensors(&mean->parameters, factor);
    scale_tensors(&mean->optimizer_state, factor);
    // Gradients accumulated towards a step differ per replica: a checkpoint of an async run
    // keeps replica 0's count and drops them (the step starts afresh).
    mean->gradients.clear();
    mean->keys_since_step = 0;
    merged.push_back(serialize_stage_state(*mean));
  }
  return merged;
}

}  // namespace troupe::actors
