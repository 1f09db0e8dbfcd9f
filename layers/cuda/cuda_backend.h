#pragma once

// Factory for the CUDA backend. This header carries no CUDA types so that the registry can
// include it; only the .cu/.cpp files of this folder include CUDA headers.

#include <memory>

#include "layers/backend.h"

namespace troupe::layers {

/// Number of CUDA devices the driver reports (0 when there is no driver or GPU).
int cuda_runtime_device_count();

/// The backend on CUDA device `device` (cuBLAS for GEMM, custom kernels for the rest), or null
/// when that device cannot be opened.
std::unique_ptr<backend> make_cuda_backend(int device);

}  // namespace troupe::layers
