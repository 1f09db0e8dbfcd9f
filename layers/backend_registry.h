#pragma once

// The one place that knows which backends were compiled in.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/backend.h"

namespace troupe::layers {

/// Whether this build contains the CUDA backend.
bool cuda_compiled();

/// Number of usable CUDA devices (0 when CUDA is not compiled in or no GPU/driver is present).
int cuda_device_count();

/// Creates the backend named by `device`: "cpu", "cuda" (device 0) or "cuda:N". `cpu_threads`
/// is the number of BLAS threads the CPU backend may use (0: every core). Returns null and
/// fills `error` when the device is unknown, not compiled in, or absent.
std::unique_ptr<backend> create_backend(const std::string& device, int cpu_threads,
                                        std::string* error);

}  // namespace troupe::layers
