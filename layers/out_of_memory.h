#pragma once

// An allocation the machine could not satisfy. It is a std::bad_alloc, so whoever catches those
// catches it too, and it says what ran out (host or device memory) and how much was asked for.

#include <cstdio>
#include <new>
#include <string>

namespace troupe::layers {

class out_of_memory : public std::bad_alloc {
 public:
  /// `memory` names what ran out ("host memory", "cuda:0 device memory"); `bytes` the request.
  out_of_memory(const std::string& memory, size_t bytes) {
    char amount[48];
    std::snprintf(amount, sizeof amount, "%.1f GB (%zu bytes)", static_cast<double>(bytes) / 1e9,
                  bytes);
    message_ = "out of " + memory + " allocating " + amount;
  }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

/// One line for a person: what ran out (an out_of_memory's own words, else host memory and the
/// exception's name) and the job keys that ask for less.
inline std::string out_of_memory_message(const std::bad_alloc& failure) {
  const std::string what = dynamic_cast<const out_of_memory*>(&failure)
                               ? failure.what()
                               : std::string("out of host memory (") + failure.what() + ")";
  return what +
         ": the job needs more memory than this machine has; lower training.batch_size or shrink "
         "model.input_shape or model.layers";
}

}  // namespace troupe::layers
