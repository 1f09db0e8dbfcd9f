// Byte-level text data for language models.

#include "layers/dataset.h"
#include "layers/text_files.h"

namespace troupe::layers {
namespace {

/// Sequences of `context` byte tokens from `bytes`, each labelled with the bytes one later.
dataset sequences_of(const std::string& bytes, int64_t context, const std::string& name) {
  dataset result;
  result.name = name;
  result.sample_shape = {context};
  result.classes = 256;
  result.labels_per_sample = context;
  const int64_t count = (static_cast<int64_t>(bytes.size()) - 1) / context;
  if (count <= 0) return result;
  result.features.resize(static_cast<size_t>(count * context));
  result.labels.resize(static_cast<size_t>(count * context));
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  for (int64_t i = 0; i < count * context; ++i) {
    result.features[i] = static_cast<float>(data[i]);
    result.labels[i] = static_cast<int32_t>(data[i + 1]);
  }
  return result;
}

}  // namespace

std::optional<text_splits> load_text_dataset(const std::string& path, int64_t context,
                                             double validation_fraction, std::string* error) {
  std::vector<text_file> files;
  if (!read_text_files(path, &files, error)) return std::nullopt;
  std::string all;
  for (const text_file& file : files) all += file.text;
  const auto held_out = static_cast<int64_t>(static_cast<double>(all.size()) * validation_fraction);
  const int64_t split = static_cast<int64_t>(all.size()) - held_out;
  text_splits result{sequences_of(all.substr(0, split), context, "text"),
                     sequences_of(all.substr(split), context, "text validation")};
  if (result.train.count() == 0 || result.validation.count() == 0) {
    *error = "data.path: '" + path + "' holds " + std::to_string(all.size()) +
             " bytes, too few for one training and one validation sequence of data.context = " +
             std::to_string(context) + " tokens (data.validation_fraction " +
             std::to_string(validation_fraction) + ")";
    return std::nullopt;
  }
  return result;
}

}  // namespace troupe::layers
