#pragma once

// Factory for the CUDA backend. This header carries no CUDA types so that the registry can
// include it; only the .cu/.cpp files of this folder include CUDA headers.

#include <memory>

#include "layers/backend.h"
#include "layers/backend_registry.h"
#include "layers/device_group.h"

namespace troupe::layers {

/// Number of CUDA devices the driver reports (0 when there is no driver or GPU).
int cuda_runtime_device_count();

/// The backend on CUDA device `device` (cuBLAS for GEMM, custom kernels for the rest), or null
/// when that device cannot be opened.
std::unique_ptr<backend> make_cuda_backend(int device);

/// Times every algorithm cuBLASLt's heuristics propose for C = op(A) op(B) exactly as
/// backend::gemm poses it (row-major, fp32 operands and output, `precision`'s compute type,
/// alpha 1, beta 0), each over `repeats` calls on `s` between CUDA events after one warm-up,
/// and returns the fastest. A, B and C are device memory on `device`; C is overwritten. Blocks
/// until the timing is done. For benchmarks: it allocates a workspace and a cuBLASLt handle.
library_gemm_timing cuda_best_library_gemm(int device, stream s, math_precision precision,
                                           transpose transpose_a, transpose transpose_b, int m,
                                           int n, int k, const float* a, int lda, const float* b,
                                           int ldb, float* c, int ldc, int repeats);

/// Whether this build links NCCL (the functions below fail with a clear error when not).
bool cuda_nccl_compiled();

/// A fresh NCCL unique id as hex digits; this process roots the bootstrap of the group that
/// joins with it. "" with `error` set when NCCL fails.
std::string cuda_nccl_group_id(std::string* error);

/// Joins every member's rank at once and waits up to `timeout_s` for their groups' other ranks
/// (in this or other processes); one group per member, or none with `error` set.
std::vector<std::unique_ptr<device_group>> cuda_join_nccl_groups(
    const std::vector<nccl_member>& members, double timeout_s, std::string* error);

}  // namespace troupe::layers
