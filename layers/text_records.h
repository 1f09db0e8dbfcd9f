#pragma once

// Byte-level language-model instances, one per record of a text, at its own length.

#include <cstdint>
#include <optional>
#include <string>

#include "layers/instance.h"

namespace troupe::layers {

/// Reads UTF-8 text at `path` with load_text_dataset's file rules (a file, or a directory's
/// regular files in name order without strfile's `.dat` and `.u8`; a missing, empty or binary
/// file refused by name) and cuts each file into records at the lines holding only "%"
/// (fortune's format); a file without such lines is one record. A record keeps its lines'
/// newlines. Each record of L ≥ 2 bytes is a sequence instance (vocabulary 256, classes 256,
/// arity 1) with tokens bytes[0, L − 1) and labels bytes[1, L), each position labelled with the
/// next byte; a record of more than context + 1 bytes is cut into consecutive pieces of at most
/// `context` tokens, and shorter records are dropped. The last `validation_fraction` of the
/// records, in file order, is the validation split. A split left empty gives nothing and one
/// line in `error`.
std::optional<instance_splits> load_text_records(const std::string& path, int64_t context,
                                                 double validation_fraction, std::string* error);

}  // namespace troupe::layers
