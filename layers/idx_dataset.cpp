// Loading MNIST-format IDX files through zlib, and whole-set feature statistics.

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "layers/dataset.h"
#include "layers/regular_file.h"

namespace troupe::layers {
namespace {

// Fashion-MNIST and MNIST both have ten classes; the IDX files do not say how many.
constexpr int idx_classes = 10;
constexpr uint32_t images_magic = 0x00000803;
constexpr uint32_t labels_magic = 0x00000801;
// A header promising more than this many bytes of data is taken as corrupt, not allocated.
constexpr uint64_t max_payload_bytes = uint64_t{1} << 31;
// gzread counts in unsigned int and answers in int, so large payloads are read in pieces.
constexpr uint64_t max_read_bytes = uint64_t{1} << 30;
// The payload buffer grows by at most this much ahead of the data actually read.
constexpr uint64_t payload_piece_bytes = uint64_t{1} << 26;

struct gz_closer {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using gz_file = std::unique_ptr<gzFile_s, gz_closer>;

/// The dimensions and raw unsigned-byte payload of one IDX file.
struct idx_contents {
  std::vector<uint32_t> dims;
  std::vector<unsigned char> payload;
};

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

// Records `text` as the problem and reports failure, so checks read as one line each.
bool fail(std::string* problem, std::string text) {
  *problem = std::move(text);
  return false;
}

uint32_t read_big_endian(const unsigned char* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

// Why the last gzread failed, in words. zlib prefixes its messages with the path, which the
// caller adds anyway, so that prefix is dropped.
std::string gz_problem(gzFile file, const std::string& path) {
  int code = Z_OK;
  std::string message = gzerror(file, &code);
  if (message.compare(0, path.size() + 2, path + ": ") == 0) message.erase(0, path.size() + 2);
  if (code == Z_ERRNO) return "read error: " + std::string(std::strerror(errno));
  if (code == Z_BUF_ERROR) return "truncated gzip stream: " + message;
  if (code == Z_DATA_ERROR) return "corrupt gzip stream: " + message;
  return "read failed: " + message;
}

// Reads up to `size` bytes; returns how many were read, or -1 after a stream or I/O error
// (a gzip stream that ends early counts as an error, not as a short file).
int64_t read_bytes(gzFile file, unsigned char* data, uint64_t size) {
  uint64_t done = 0;
  while (done < size) {
    uint64_t piece = std::min(size - done, max_read_bytes);
    int got = gzread(file, data + done, static_cast<unsigned>(piece));
    if (got < 0) return -1;
    if (got == 0) break;
    done += static_cast<uint64_t>(got);
  }
  int code = Z_OK;
  gzerror(file, &code);
  return code == Z_OK ? static_cast<int64_t>(done) : -1;
}

// Reads up to `size` bytes into `out`, growing it a piece at a time so that a header which
// overstates the size costs no more memory than the file really holds. Returns false after a
// stream or I/O error.
bool read_growing(gzFile file, uint64_t size, std::vector<unsigned char>& out) {
  out.clear();
  while (out.size() < size) {
    uint64_t start = out.size();
    uint64_t piece = std::min(size - start, payload_piece_bytes);
    out.resize(start + piece);
    int64_t got = read_bytes(file, out.data() + start, piece);
    if (got < 0) return false;
    out.resize(start + static_cast<uint64_t>(got));
    if (static_cast<uint64_t>(got) < piece) break;
  }
  return true;
}

// Picks `directory/base.gz`, else the uncompressed `directory/base`.
std::optional<std::string> find_file(const std::string& directory, const std::string& base,
                                     std::string* error) {
  std::filesystem::path compressed = std::filesystem::path(directory) / (base + ".gz");
  std::filesystem::path plain = std::filesystem::path(directory) / base;
  std::error_code ignored;
  if (std::filesystem::exists(compressed, ignored)) return compressed.string();
  if (std::filesystem::exists(plain, ignored)) return plain.string();
  *error = compressed.string() + ": file not found (nor uncompressed " + plain.string() + ")";
  return std::nullopt;
}

// Checks the magic number and reads the dimensions that follow it.
bool read_header(gzFile file, const std::string& path, uint32_t expected_magic,
                 idx_contents& contents, std::string* problem) {
  unsigned char magic_bytes[4];
  int64_t got = read_bytes(file, magic_bytes, 4);
  if (got < 0) return fail(problem, gz_problem(file, path));
  if (got < 4) return fail(problem, "truncated header: only " + std::to_string(got) + " bytes");
  uint32_t magic = read_big_endian(magic_bytes);
  if ((magic & 0xffffff00u) != (expected_magic & 0xffffff00u)) {
    return fail(problem,
                "bad magic: expected " + hex32(expected_magic) + ", found " + hex32(magic));
  }
  if (magic != expected_magic) {
    return fail(problem, "wrong number of dimensions: expected " +
                             std::to_string(expected_magic & 0xff) + " (magic " +
                             hex32(expected_magic) + "), found " + std::to_string(magic & 0xff) +
                             " (magic " + hex32(magic) + ")");
  }
  std::vector<unsigned char> dim_bytes(4 * (expected_magic & 0xff));
  got = read_bytes(file, dim_bytes.data(), dim_bytes.size());
  if (got < 0) return fail(problem, gz_problem(file, path));
  if (got < static_cast<int64_t>(dim_bytes.size())) {
    return fail(problem, "truncated header: dimensions cut off");
  }
  for (size_t i = 0; i < dim_bytes.size(); i += 4) {
    contents.dims.push_back(read_big_endian(&dim_bytes[i]));
  }
  return true;
}

// Reads exactly the payload the dimensions promise, and insists nothing follows it. Reading
// past the end also makes zlib check the gzip trailer, which catches corrupted data.
bool read_payload(gzFile file, const std::string& path, idx_contents& contents,
                  std::string* problem) {
  uint64_t expected = 1;
  for (uint32_t dim : contents.dims) {
    expected *= dim;
    if (expected > max_payload_bytes) {
      return fail(problem, "header sizes are absurd: more than " +
                               std::to_string(max_payload_bytes) + " bytes of data");
    }
  }
  if (contents.dims[0] == 0) return fail(problem, "zero items");
  if (expected == 0) return fail(problem, "zero-sized items");
  if (!read_growing(file, expected, contents.payload)) {
    return fail(problem, gz_problem(file, path));
  }
  uint64_t got = contents.payload.size();
  if (got < expected) {
    return fail(problem, "truncated: header says " + std::to_string(contents.dims[0]) +
                             " items, expected " + std::to_string(expected) +
                             " bytes of data, got " + std::to_string(got));
  }
  unsigned char extra = 0;
  int64_t extra_bytes = read_bytes(file, &extra, 1);
  if (extra_bytes < 0) return fail(problem, gz_problem(file, path));
  if (extra_bytes > 0) return fail(problem, "trailing data after the last item");
  return true;
}

std::optional<idx_contents> read_idx(const std::string& path, uint32_t expected_magic,
                                     std::string* error) {
  const int descriptor = open_regular_file(path, error);
  if (descriptor < 0) return std::nullopt;
  errno = 0;
  gz_file file(gzdopen(descriptor, "rb"));
  if (!file) {
    ::close(descriptor);
    *error = path + ": cannot open: " + (errno != 0 ? std::strerror(errno) : "out of memory");
    return std::nullopt;
  }
  gzbuffer(file.get(), 1 << 18);
  idx_contents contents;
  std::string problem;
  if (!read_header(file.get(), path, expected_magic, contents, &problem) ||
      !read_payload(file.get(), path, contents, &problem)) {
    *error = path + ": " + problem;
    return std::nullopt;
  }
  return contents;
}

// Returns false and names the first label outside [0, classes).
bool check_labels(const std::string& path, const std::vector<unsigned char>& labels, int classes,
                  std::string* error) {
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= classes) {
      *error = path + ": label " + std::to_string(labels[i]) + " at index " + std::to_string(i) +
               " is out of range (" + std::to_string(classes) + " classes)";
      return false;
    }
  }
  return true;
}

dataset make_dataset(const idx_contents& images, const idx_contents& labels) {
  dataset data;
  data.name = "fashion-mnist";
  data.sample_shape = {1, images.dims[1], images.dims[2]};
  data.classes = idx_classes;
  data.features.resize(images.payload.size());
  const unsigned char* pixels = images.payload.data();
  float* features = data.features.data();
  for (size_t i = 0, n = images.payload.size(); i < n; ++i) {
    features[i] = static_cast<float>(pixels[i]) / 255.0f;
  }
  data.labels.assign(labels.payload.begin(), labels.payload.end());
  return data;
}

}  // namespace

std::optional<dataset> load_idx_dataset(const std::string& directory, const std::string& split,
                                        std::string* error) {
  std::string ignored;
  if (error == nullptr) error = &ignored;
  auto images_path = find_file(directory, split + "-images-idx3-ubyte", error);
  if (!images_path) return std::nullopt;
  auto labels_path = find_file(directory, split + "-labels-idx1-ubyte", error);
  if (!labels_path) return std::nullopt;
  auto images = read_idx(*images_path, images_magic, error);
  if (!images) return std::nullopt;
  auto labels = read_idx(*labels_path, labels_magic, error);
  if (!labels) return std::nullopt;
  if (images->dims[0] != labels->dims[0]) {
    *error = "count mismatch: " + std::to_string(images->dims[0]) + " images in " + *images_path +
             " but " + std::to_string(labels->dims[0]) + " labels in " + *labels_path;
    return std::nullopt;
  }
  if (!check_labels(*labels_path, labels->payload, idx_classes, error)) return std::nullopt;
  return make_dataset(*images, *labels);
}

void standardize(dataset& data, float mean, float deviation) {
  for (float& value : data.features) value = (value - mean) / deviation;
}

void feature_statistics(const dataset& data, float* mean, float* deviation) {
  const std::vector<float>& values = data.features;
  if (values.empty()) {
    *mean = 0.0f;
    *deviation = 0.0f;
    return;
  }
  // Two passes in double: the one-pass formula loses precision over tens of millions of values.
  double sum = 0.0;
  for (float value : values) sum += value;
  double average = sum / static_cast<double>(values.size());
  double squares = 0.0;
  for (float value : values) squares += (value - average) * (value - average);
  *mean = static_cast<float>(average);
  *deviation = static_cast<float>(std::sqrt(squares / static_cast<double>(values.size())));
}

void truncate(dataset& data, int64_t count) {
  if (count <= 0 || count >= data.count()) return;
  data.labels.resize(static_cast<size_t>(count * data.labels_per_sample));
  data.features.resize(static_cast<size_t>(count * data.sample_size()));
}

}  // namespace troupe::layers
