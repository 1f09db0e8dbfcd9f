#pragma once

// Reading UTF-8 text files for the text data sets (text_dataset.cpp, text_records.cpp): the
// same file rules for both. Internal to troupe_layers' data loaders.

#include <string>
#include <vector>

namespace troupe::layers {

/// One file's path and its whole text.
struct text_file {
  std::string path;
  std::string text;
};

/// Reads the UTF-8 text at `path`: a file, or a directory whose regular files are read in name
/// order (skipping hidden files, strfile's `.dat` indexes and `.u8` links, links and empty
/// files). A missing path, an empty or binary (NUL bytes or invalid UTF-8) file, or a directory
/// with no text, gives false and one line in `error` naming it (as data.path).
bool read_text_files(const std::string& path, std::vector<text_file>* files, std::string* error);

}  // namespace troupe::layers
