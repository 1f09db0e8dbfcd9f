#pragma once

// Model weights in the safetensors format, the one PyTorch, JAX and Hugging Face tools read
// without running any code: an 8-byte little-endian header length N, N bytes of JSON naming
// each tensor's dtype, shape and byte range, then the raw little-endian data. troupe writes and
// reads float32 ("F32") tensors only. A job's model weights as such tensors:
// actors/storage/model_weights.h.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine/stage_state.h"
#include "actors/storage/file_system.h"

namespace troupe::actors {

/// Writes `tensors`, contiguously in the order given, and `metadata` (the header's
/// "__metadata__", omitted when empty) to `path` atomically through `files` (see
/// file_system::write_atomically). False, with `error` naming the file or tensor, when a name
/// is repeated or empty, a tensor's values do not match its shape, or the file cannot be
/// written.
bool write_safetensors(const std::string& path, const std::vector<named_tensor>& tensors,
                       const std::map<std::string, std::string>& metadata, std::string* error,
                       file_system& files = posix_files());

/// Reads the tensors of a safetensors file, in the order of their data. Every rule of the format
/// is checked before any tensor is allocated (header length within the file and at most 100 MB,
/// a JSON object, dtype F32, non-negative shapes, byte ranges that match the shapes and tile the
/// data section exactly, unique names), so a hostile file costs no more memory than its header.
/// Nothing, with `error` naming the file and, where one is at fault, the tensor, otherwise.
std::optional<std::vector<named_tensor>> read_safetensors(const std::string& path,
                                                          std::string* error);

}  // namespace troupe::actors
