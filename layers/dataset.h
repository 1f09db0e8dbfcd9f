#pragma once

// Data sets held in host memory, and the seeded batch order over them.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/instance.h"
#include "layers/tensor.h"

namespace troupe::layers {

/// Labelled samples in host memory: `features` holds count() samples of sample_size() floats,
/// `labels` labels_per_sample labels per sample (1 for a class, T for a sequence of T tokens,
/// each labelled with the token after it).
struct dataset {
  std::string name;
  shape sample_shape;
  int classes = 0;
  int64_t labels_per_sample = 1;
  std::vector<float> features;
  std::vector<int32_t> labels;
  /// A dynamic model's data: one instance per sample, each of its own size (features and
  /// labels stay empty; sample_shape is {1}, a token id per part).
  std::shared_ptr<const instance_dataset> instances;

  int64_t count() const {
    if (instances) return instances->count();
    return static_cast<int64_t>(labels.size()) / labels_per_sample;
  }
  int64_t sample_size() const { return element_count(sample_shape); }
};

/// Reads an MNIST-format pair of IDX files (`PREFIX-images-idx3-ubyte[.gz]` and
/// `PREFIX-labels-idx1-ubyte[.gz]`, gzip read through zlib) from `directory`; `split` is
/// "train" or "t10k". Pixels are scaled to [0, 1]. On failure returns nothing and sets `error`
/// to one line naming the file and what is wrong (missing, truncated, bad magic, count
/// mismatch between images and labels, label out of range).
std::optional<dataset> load_idx_dataset(const std::string& directory, const std::string& split,
                                        std::string* error);

/// Byte-level language-model data from UTF-8 text: `path` is a file or a directory whose regular
/// files are read in name order (skipping strfile's `.dat` indexes and `.u8` links). The bytes
/// are concatenated and cut into sequences of `context` tokens (vocabulary 256), each labelled
/// with the following bytes; the last `validation_fraction` of the text is held out as the test
/// split. A missing, empty or binary (NUL bytes or invalid UTF-8) file, or a directory with
/// no text, gives nothing and one line in `error` naming it.
struct text_splits {
  dataset train;
  dataset validation;
};
std::optional<text_splits> load_text_dataset(const std::string& path, int64_t context,
                                             double validation_fraction, std::string* error);

/// Subtracts `mean` and divides by `deviation` in every feature.
void standardize(dataset& data, float mean, float deviation);

/// Mean and standard deviation over all features of `data`.
void feature_statistics(const dataset& data, float* mean, float* deviation);

/// Keeps only the first `count` samples (no-op when count <= 0 or count >= data.count()).
void truncate(dataset& data, int64_t count);

/// A learnable synthetic classification set: one random prototype per class plus seeded
/// Gaussian noise, so benchmarks run without files and small models can still fit it.
dataset make_synthetic_dataset(int64_t count, const shape& sample_shape, int classes,
                               uint64_t seed);

/// The order in which one epoch visits a data set, in batches of `batch_size`. The order is a
/// function of (seed, epoch) alone, so a run can resume mid-epoch from (epoch, batch index).
class batch_order {
 public:
  /// drop_last: the final partial batch is skipped (training); otherwise it is kept (evaluation).
  batch_order(int64_t sample_count, int64_t batch_size, uint64_t seed, bool shuffle,
              bool drop_last);

  /// Lays out the order of `epoch` (a seeded Fisher-Yates shuffle when shuffling).
  void start_epoch(int64_t epoch);
  int64_t batches_per_epoch() const;
  /// Number of samples in batch `index` (batch_size except for a kept final partial batch).
  int64_t batch_samples(int64_t index) const;
  /// Copies batch `index` of the current epoch into `features` (batch_samples × sample_size)
  /// and `labels` (batch_samples × labels_per_sample).
  void gather(const dataset& data, int64_t index, float* features, int32_t* labels) const;
  const std::vector<int64_t>& order() const { return order_; }

 private:
  int64_t sample_count_;
  int64_t batch_size_;
  uint64_t seed_;
  bool shuffle_;
  bool drop_last_;
  std::vector<int64_t> order_;
};

}  // namespace troupe::layers
