// Reading UTF-8 text files for the text data sets.

#include "layers/text_files.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#include "layers/regular_file.h"

namespace troupe::layers {
namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The offset of the first byte that breaks UTF-8 (a NUL counts: text has none), or -1.
int64_t first_invalid_byte(const std::string& bytes) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  const int64_t size = static_cast<int64_t>(bytes.size());
  for (int64_t i = 0; i < size;) {
    const unsigned char lead = data[i];
    int length = 0;
    if (lead == 0) return i;
    if (lead < 0x80)
      length = 1;
    else if (lead >= 0xc2 && lead <= 0xdf)
      length = 2;
    else if (lead >= 0xe0 && lead <= 0xef)
      length = 3;
    else if (lead >= 0xf0 && lead <= 0xf4)
      length = 4;
    else
      return i;
    if (i + length > size) return i;
    for (int k = 1; k < length; ++k) {
      if ((data[i + k] & 0xc0) != 0x80) return i;
    }
    // Overlong three- and four-byte forms, surrogates and code points past U+10FFFF.
    if (length == 3 &&
        ((lead == 0xe0 && data[i + 1] < 0xa0) || (lead == 0xed && data[i + 1] > 0x9f)))
      return i;
    if (length == 4 &&
        ((lead == 0xf0 && data[i + 1] < 0x90) || (lead == 0xf4 && data[i + 1] > 0x8f)))
      return i;
    i += length;
  }
  return -1;
}

bool read_text_file(const std::string& path, std::string* text, std::string* error) {
  std::string problem;
  const int descriptor = open_regular_file(path, &problem);
  if (descriptor < 0) {
    *error = "data.path: " + problem;
    return false;
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(::fdopen(descriptor, "rb"), std::fclose);
  if (file == nullptr) {
    ::close(descriptor);
    *error = "data.path: cannot open '" + path + "': " + std::strerror(errno);
    return false;
  }
  char buffer[1 << 16];
  size_t count = 0;
  text->clear();
  while ((count = std::fread(buffer, 1, sizeof buffer, file.get())) > 0)
    text->append(buffer, count);
  if (std::ferror(file.get())) {
    *error = "data.path: cannot read '" + path + "': " + std::strerror(errno);
    return false;
  }
  if (text->empty()) {
    *error = "data.path: '" + path + "' is empty";
    return false;
  }
  const int64_t bad = first_invalid_byte(*text);
  if (bad >= 0) {
    *error = "data.path: '" + path + "' is not UTF-8 text (byte " + std::to_string(bad) +
             (static_cast<unsigned char>((*text)[bad]) == 0 ? " is NUL)" : " is invalid)");
    return false;
  }
  return true;
}

/// The text files of a directory, by name: regular files only, without strfile's indexes.
bool list_text_files(const std::string& directory, std::vector<std::string>* files,
                     std::string* error) {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir(directory.c_str()), closedir);
  if (dir == nullptr) {
    *error = "data.path: cannot open directory '" + directory + "': " + std::strerror(errno);
    return false;
  }
  while (const dirent* entry = readdir(dir.get())) {
    const std::string name = entry->d_name;
    if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8"))
      continue;
    const std::string path = directory + "/" + name;
    struct stat info;
    if (lstat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode) || info.st_size == 0) continue;
    files->push_back(path);
  }
  std::sort(files->begin(), files->end());
  if (files->empty()) {
    *error = "data.path: directory '" + directory + "' has no readable text files";
    return false;
  }
  return true;
}

}  // namespace

bool read_text_files(const std::string& path, std::vector<text_file>* files, std::string* error) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    *error = "data.path: '" + path + "' does not exist" +
             (path == "/usr/share/games/fortunes" ? " (install Debian's fortunes package)" : "");
    return false;
  }
  std::vector<std::string> paths;
  if (S_ISDIR(info.st_mode)) {
    if (!list_text_files(path, &paths, error)) return false;
  } else {
    paths.push_back(path);
  }
  files->clear();
  for (const std::string& file : paths) {
    files->push_back({file, {}});
    if (!read_text_file(file, &files->back().text, error)) return false;
  }
  return true;
}

}  // namespace troupe::layers
