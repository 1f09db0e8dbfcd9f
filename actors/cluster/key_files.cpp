#include "actors/cluster/key_files.h"

namespace troupe::actors {

bool write_key_pair(const std::string& directory, const std::string& name,
                    const transport::curve_key_pair& pair, std::string* error, file_system& files) {
  const std::string problem = transport::key_pair_problem(name, pair);
  if (!problem.empty()) {
    *error = directory + "/" + problem;
    return false;
  }
  const std::string secret_path = directory + "/" + name + ".key";
  if (!files.create_directories(directory, error, 0700)) return false;
  if (files.exists(secret_path)) {
    *error = secret_path + ": already exists; remove it to replace the key";
    return false;
  }
  return files.write_atomically(secret_path, pair.secret_key + "\n", error, 0600) &&
         files.write_atomically(directory + "/" + name + ".pub", pair.public_key + "\n", error,
                                0644);
}

}  // namespace troupe::actors
