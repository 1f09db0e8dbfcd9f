#pragma once

// CURVE key files (`troupe keygen DIR`): NAME.key, the secret, readable by its owner alone, and
// NAME.pub, written through the file layer. transport/curve.h reads them.

#include <string>

#include "actors/storage/file_system.h"
#include "transport/curve.h"

namespace troupe::actors {

/// Writes `directory`/NAME.key (the secret key, mode 0600) and NAME.pub (the public key, mode
/// 0644) through `files`, each atomically, creating the directory (mode 0700) if needed.
/// Refuses a name or pair that transport::key_pair_problem() finds fault with, and an existing
/// NAME.key (a lost secret cannot be recovered). False, with `error` naming the file.
bool write_key_pair(const std::string& directory, const std::string& name,
                    const transport::curve_key_pair& pair, std::string* error,
                    file_system& files = posix_files());

}  // namespace troupe::actors
