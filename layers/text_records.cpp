// Byte-level language-model instances from the records of a text (fortunes).

#include "layers/text_records.h"

#include <algorithm>
#include <vector>

#include "layers/text_files.h"

namespace troupe::layers {
namespace {

/// Whether the line of `text` from `begin` to `end` (its newline excluded) is a separator.
bool is_separator(const std::string& text, size_t begin, size_t end) {
  if (end > begin && text[end - 1] == '\r') --end;
  return end == begin + 1 && text[begin] == '%';
}

/// The records of one file's text, those of fewer than 2 bytes left out.
void append_records(const std::string& text, std::vector<std::string>* records) {
  std::string record;
  auto finish = [&]() {
    if (record.size() >= 2) records->push_back(record);
    record.clear();
  };
  for (size_t begin = 0; begin < text.size();) {
    const size_t newline = text.find('\n', begin);
    const size_t end = newline == std::string::npos ? text.size() : newline;
    const size_t next = newline == std::string::npos ? text.size() : newline + 1;
    if (is_separator(text, begin, end))
      finish();
    else
      record.append(text, begin, next - begin);
    begin = next;
  }
  finish();
}

/// The instances of one record: pieces of at most `context` tokens, each labelled with the
/// bytes one later.
void append_pieces(const std::string& record, int64_t context, instance_dataset* data) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(record.data());
  const auto tokens = static_cast<int64_t>(record.size()) - 1;
  for (int64_t start = 0; start < tokens; start += context) {
    const int64_t length = std::min(context, tokens - start);
    instance piece;
    piece.tokens.assign(bytes + start, bytes + start + length);
    piece.labels.assign(bytes + start + 1, bytes + start + length + 1);
    data->instances.push_back(std::move(piece));
  }
}

instance_dataset empty_records(const std::string& name) {
  instance_dataset data;
  data.name = name;
  data.vocabulary = 256;
  data.classes = 256;
  data.arity = 1;
  return data;
}

}  // namespace

std::optional<instance_splits> load_text_records(const std::string& path, int64_t context,
                                                 double validation_fraction, std::string* error) {
  if (context < 1) {
    *error = "data.context must be at least 1";
    return std::nullopt;
  }
  std::vector<text_file> files;
  if (!read_text_files(path, &files, error)) return std::nullopt;
  std::vector<std::string> records;
  for (const text_file& file : files) append_records(file.text, &records);
  const auto count = static_cast<int64_t>(records.size());
  const auto held_out = static_cast<int64_t>(static_cast<double>(count) * validation_fraction);
  instance_splits result{empty_records("text records"), empty_records("text records validation")};
  for (int64_t i = 0; i < count; ++i)
    append_pieces(records[static_cast<size_t>(i)], context,
                  i < count - held_out ? &result.train : &result.validation);
  if (result.train.count() == 0 || result.validation.count() == 0) {
    *error = "data.path: '" + path + "' holds " + std::to_string(count) +
             " records of 2 bytes or more, too few for one training and one validation record " +
             "(data.validation_fraction " + std::to_string(validation_fraction) + ")";
    return std::nullopt;
  }
  return result;
}

}  // namespace troupe::layers
