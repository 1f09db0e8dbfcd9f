#include "layers/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/layers/temp_directory.h"

namespace troupe::layers {
namespace {

namespace fs = std::filesystem;
using bytes = std::vector<unsigned char>;

const char* const fashion_mnist_directory = "/usr/share/datasets/fashion-mnist";

void append_big_endian(bytes& out, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back((value >> shift) & 0xff);
}

/// An IDX file: the magic, the dimensions, then `payload` as is (which may disagree with them).
bytes idx_file(uint32_t magic, const std::vector<uint32_t>& dims, const bytes& payload) {
  bytes out;
  append_big_endian(out, magic);
  for (uint32_t dim : dims) append_big_endian(out, dim);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void write_raw(const std::string& path, const bytes& contents) {
  std::ofstream file(path, std::ios::binary);
  file.write(reinterpret_cast<const char*>(contents.data()), contents.size());
  ASSERT_TRUE(file.good()) << path;
}

void write_gzip(const std::string& path, const bytes& contents) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  if (!contents.empty()) {
    ASSERT_EQ(gzwrite(file, contents.data(), contents.size()), static_cast<int>(contents.size()));
  }
  ASSERT_EQ(gzclose(file), Z_OK);
}

bytes read_raw(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return bytes(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

// Four 2×3 images: pixels 0, 1, …, 17, then six spread over [0, 255]; labels 4, 0, 9, 7.
const bytes small_pixels = {0,  1,  2,  3,  4,  5,  6, 7,  8,   9,   10,  11,
                            12, 13, 14, 15, 16, 17, 0, 51, 102, 153, 204, 255};
bytes small_images() { return idx_file(0x803, {4, 2, 3}, small_pixels); }
bytes small_labels() { return idx_file(0x801, {4}, {4, 0, 9, 7}); }

/// Expects `error` to contain each of `words`.
void expect_mentions(const std::string& error, std::initializer_list<std::string> words) {
  for (const std::string& word : words) {
    EXPECT_NE(error.find(word), std::string::npos) << "no \"" << word << "\" in: " << error;
  }
}

/// Writes the gzip pair for split "train" into `dir` and returns the load error (empty if none).
std::string load_error(const temp_directory& dir, const bytes& images, const bytes& labels) {
  write_gzip(dir.file("train-images-idx3-ubyte.gz"), images);
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"), labels);
  std::string error;
  std::optional<dataset> data = load_idx_dataset(dir.path(), "train", &error);
  EXPECT_FALSE(data.has_value());
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  return error;
}

void expect_small_set(const std::optional<dataset>& data, const std::string& error) {
  ASSERT_TRUE(data.has_value()) << error;
  EXPECT_EQ(data->name, "fashion-mnist");
  EXPECT_EQ(data->sample_shape, (shape{1, 2, 3}));
  EXPECT_EQ(data->classes, 10);
  EXPECT_EQ(data->count(), 4);
  EXPECT_EQ(data->labels, (std::vector<int32_t>{4, 0, 9, 7}));
  ASSERT_EQ(data->features.size(), small_pixels.size());
  for (size_t i = 0; i < small_pixels.size(); ++i) {
    EXPECT_FLOAT_EQ(data->features[i], small_pixels[i] / 255.0f) << i;
  }
}

TEST(IdxDatasetTest, LoadsGzipFiles) {
  temp_directory dir;
  write_gzip(dir.file("train-images-idx3-ubyte.gz"), small_images());
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"), small_labels());
  std::string error;
  expect_small_set(load_idx_dataset(dir.path(), "train", &error), error);
}

TEST(IdxDatasetTest, LoadsUncompressedFiles) {
  temp_directory dir;
  write_raw(dir.file("t10k-images-idx3-ubyte"), small_images());
  write_raw(dir.file("t10k-labels-idx1-ubyte"), small_labels());
  std::string error;
  expect_small_set(load_idx_dataset(dir.path(), "t10k", &error), error);
}

TEST(IdxDatasetTest, PrefersGzipOverUncompressed) {
  temp_directory dir;
  write_gzip(dir.file("train-images-idx3-ubyte.gz"), small_images());
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"), small_labels());
  write_raw(dir.file("train-images-idx3-ubyte"), {1, 2, 3});
  write_raw(dir.file("train-labels-idx1-ubyte"), {1, 2, 3});
  std::string error;
  expect_small_set(load_idx_dataset(dir.path(), "train", &error), error);
}

TEST(IdxDatasetTest, MissingFileIsNamed) {
  temp_directory dir;
  std::string error;
  EXPECT_FALSE(load_idx_dataset(dir.path(), "train", &error).has_value());
  expect_mentions(error, {dir.file("train-images-idx3-ubyte.gz"), "not found"});

  write_gzip(dir.file("train-images-idx3-ubyte.gz"), small_images());
  EXPECT_FALSE(load_idx_dataset(dir.path(), "train", &error).has_value());
  expect_mentions(error, {"train-labels-idx1-ubyte", "not found"});
}

TEST(IdxDatasetTest, UnreadableFileIsNamed) {
  temp_directory dir;
  // A directory where the file should be: it exists but cannot be read as a file.
  fs::create_directory(dir.file("train-images-idx3-ubyte.gz"));
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"), small_labels());
  std::string error;
  EXPECT_FALSE(load_idx_dataset(dir.path(), "train", &error).has_value());
  expect_mentions(error,
                  {dir.file("train-images-idx3-ubyte.gz"), "a directory, not a regular file"});
}

TEST(IdxDatasetTest, CorruptGzipStreamIsReported) {
  temp_directory dir;
  bytes images = small_images();
  images.resize(4000, 7);  // long enough that the damage below lands in compressed data
  for (size_t i = 16; i < images.size(); ++i) images[i] = static_cast<unsigned char>(i * 31);
  std::string path = dir.file("train-images-idx3-ubyte.gz");
  write_gzip(path, images);
  bytes compressed = read_raw(path);
  for (size_t i = 20; i < compressed.size() - 12; i += 7) compressed[i] ^= 0x5a;
  write_raw(path, compressed);
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"), small_labels());
  std::string error;
  EXPECT_FALSE(load_idx_dataset(dir.path(), "train", &error).has_value());
  expect_mentions(error, {path, "gzip"});
}

TEST(IdxDatasetTest, TruncatedGzipStreamIsReported) {
  temp_directory dir;
  bytes pixels(2 * 28 * 28);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<unsigned char>(i * i * 7919);
  bytes images = idx_file(0x803, {2, 28, 28}, pixels);
  std::string path = dir.file("train-images-idx3-ubyte.gz");
  write_gzip(path, images);
  bytes compressed = read_raw(path);
  compressed.resize(compressed.size() / 2);
  write_raw(path, compressed);
  write_gzip(dir.file("train-labels-idx1-ubyte.gz"), idx_file(0x801, {2}, {1, 2}));
  std::string error;
  EXPECT_FALSE(load_idx_dataset(dir.path(), "train", &error).has_value());
  expect_mentions(error, {path, "truncated"});
}

TEST(IdxDatasetTest, BadMagicSaysExpectedAndFound) {
  temp_directory dir;
  std::string error =
      load_error(dir, idx_file(0x12345678, {4, 2, 3}, small_pixels), small_labels());
  expect_mentions(error, {"train-images-idx3-ubyte.gz", "magic", "0x00000803", "0x12345678"});
}

TEST(IdxDatasetTest, WrongDimensionCountIsReported) {
  temp_directory dir;
  std::string error = load_error(dir, idx_file(0x802, {4, 6}, small_pixels), small_labels());
  expect_mentions(error, {"train-images-idx3-ubyte.gz", "dimensions"});

  error = load_error(dir, small_images(), idx_file(0x803, {4, 1, 1}, {1, 2, 3, 4}));
  expect_mentions(error, {"train-labels-idx1-ubyte.gz", "dimensions"});
}

TEST(IdxDatasetTest, TruncatedDataSaysExpectedAndGotBytes) {
  temp_directory dir;
  bytes short_pixels(small_pixels.begin(), small_pixels.end() - 5);
  std::string error = load_error(dir, idx_file(0x803, {4, 2, 3}, short_pixels), small_labels());
  expect_mentions(error, {"train-images-idx3-ubyte.gz", "truncated", "expected 24", "got 19"});
}

TEST(IdxDatasetTest, OverstatedCountIsTruncatedWithoutAllocatingIt) {
  temp_directory dir;
  // 1.5 GB promised, 24 bytes present: reported as truncated after reading what is there.
  std::string error =
      load_error(dir, idx_file(0x803, {2000000, 28, 28}, small_pixels), small_labels());
  expect_mentions(error,
                  {"train-images-idx3-ubyte.gz", "truncated", "expected 1568000000", "got 24"});
}

TEST(IdxDatasetTest, TruncatedHeaderIsReported) {
  temp_directory dir;
  std::string error = load_error(dir, small_images(), {0, 0, 8});
  expect_mentions(error, {"train-labels-idx1-ubyte.gz", "truncated"});

  error = load_error(dir, idx_file(0x803, {4}, {}), small_labels());
  expect_mentions(error, {"train-images-idx3-ubyte.gz", "truncated"});
}

TEST(IdxDatasetTest, EmptyFileIsReported) {
  temp_directory dir;
  std::string error = load_error(dir, {}, small_labels());
  expect_mentions(error, {"train-images-idx3-ubyte.gz", "truncated"});
}

TEST(IdxDatasetTest, TrailingDataIsRejected) {
  temp_directory dir;
  bytes labels = small_labels();
  labels.push_back(3);
  std::string error = load_error(dir, small_images(), labels);
  expect_mentions(error, {"train-labels-idx1-ubyte.gz", "trailing"});
}

TEST(IdxDatasetTest, CountMismatchNamesBothFiles) {
  temp_directory dir;
  std::string error = load_error(dir, small_images(), idx_file(0x801, {3}, {1, 2, 3}));
  expect_mentions(error, {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "count",
                          "4 images", "3 labels"});
}

TEST(IdxDatasetTest, LabelOutOfRangeNamesIndexAndValue) {
  temp_directory dir;
  std::string error = load_error(dir, small_images(), idx_file(0x801, {4}, {1, 2, 10, 200}));
  expect_mentions(error, {"train-labels-idx1-ubyte.gz", "label 10", "index 2"});
}

TEST(IdxDatasetTest, ZeroItemsAreRejected) {
  temp_directory dir;
  std::string error = load_error(dir, idx_file(0x803, {0, 28, 28}, {}), idx_file(0x801, {0}, {}));
  expect_mentions(error, {"train-images-idx3-ubyte.gz", "zero"});
}

TEST(IdxDatasetTest, AbsurdHeaderSizesAreRejectedBeforeAllocating) {
  temp_directory dir;
  std::string error = load_error(
      dir, idx_file(0x803, {0xffffffffu, 0xffffffffu, 0xffffffffu}, small_pixels), small_labels());
  expect_mentions(error, {"train-images-idx3-ubyte.gz", "absurd"});
}

TEST(IdxDatasetTest, NullErrorPointerIsAllowed) {
  temp_directory dir;
  EXPECT_FALSE(load_idx_dataset(dir.path(), "train", nullptr).has_value());
}

TEST(IdxDatasetTest, LoadsFashionMnist) {
  if (!fs::exists(fashion_mnist_directory)) GTEST_SKIP() << fashion_mnist_directory << " absent";
  for (auto [split, count] : {std::pair<const char*, int64_t>{"train", 60000}, {"t10k", 10000}}) {
    std::string error;
    std::optional<dataset> data = load_idx_dataset(fashion_mnist_directory, split, &error);
    ASSERT_TRUE(data.has_value()) << error;
    EXPECT_EQ(data->count(), count) << split;
    EXPECT_EQ(data->sample_shape, (shape{1, 28, 28}));
    EXPECT_EQ(data->features.size(), static_cast<size_t>(count * 28 * 28));
    std::vector<int64_t> per_class(10, 0);
    for (int32_t label : data->labels) {
      ASSERT_TRUE(label >= 0 && label < 10) << label;
      ++per_class[label];
    }
    // Fashion-MNIST is exactly balanced.
    for (int64_t n : per_class) EXPECT_EQ(n, count / 10) << split;
    auto [low, high] = std::minmax_element(data->features.begin(), data->features.end());
    EXPECT_EQ(*low, 0.0f);
    EXPECT_EQ(*high, 1.0f);
  }
}

TEST(IdxDatasetTest, StandardizeGivesZeroMeanUnitDeviation) {
  dataset data = make_synthetic_dataset(500, {3, 4}, 3, 11);
  for (float& value : data.features) value = value * 3.0f + 5.0f;
  float mean = 0, deviation = 0;
  feature_statistics(data, &mean, &deviation);
  EXPECT_GT(std::fabs(mean), 1.0f);
  EXPECT_GT(deviation, 1.5f);
  standardize(data, mean, deviation);
  feature_statistics(data, &mean, &deviation);
  EXPECT_NEAR(mean, 0.0f, 1e-5f);
  EXPECT_NEAR(deviation, 1.0f, 1e-5f);
}

TEST(IdxDatasetTest, FeatureStatisticsOfKnownValues) {
  dataset data;
  data.sample_shape = {2};
  data.features = {1, 3, 5, 7};
  data.labels = {0, 1};
  float mean = 0, deviation = 0;
  feature_statistics(data, &mean, &deviation);
  EXPECT_FLOAT_EQ(mean, 4.0f);
  EXPECT_FLOAT_EQ(deviation, std::sqrt(5.0f));
}

TEST(IdxDatasetTest, TruncateKeepsLeadingSamples) {
  dataset data = make_synthetic_dataset(10, {2, 3}, 4, 5);
  dataset original = data;
  truncate(data, 0);
  EXPECT_EQ(data.count(), 10);
  truncate(data, 20);
  EXPECT_EQ(data.count(), 10);
  truncate(data, 4);
  ASSERT_EQ(data.count(), 4);
  EXPECT_EQ(data.features.size(), 24u);
  EXPECT_TRUE(std::equal(data.features.begin(), data.features.end(), original.features.begin()));
  EXPECT_TRUE(std::equal(data.labels.begin(), data.labels.end(), original.labels.begin()));
}

}  // namespace
}  // namespace troupe::layers

namespace troupe::layers {
namespace {

TEST(DatasetTruncateTest, KeepsWholeSamplesWithAllTheirLabels) {
  // Three sequences of 4 tokens, each token labelled: truncated to 2 sequences, not 2 labels.
  dataset text;
  text.sample_shape = {4};
  text.labels_per_sample = 4;
  for (int i = 0; i < 12; ++i) {
    text.features.push_back(static_cast<float>(i));
    text.labels.push_back(i);
  }
  truncate(text, 2);
  EXPECT_EQ(text.count(), 2);
  EXPECT_EQ(text.labels.size(), 8u);
  EXPECT_EQ(text.features.size(), 8u);
  EXPECT_EQ(text.labels.back(), 7);
  truncate(text, 5);  // more than it holds: unchanged
  EXPECT_EQ(text.count(), 2);
}

}  // namespace
}  // namespace troupe::layers
