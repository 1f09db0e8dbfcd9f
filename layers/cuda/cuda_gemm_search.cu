// cuBLAS's best for one GEMM shape: every algorithm that cuBLASLt's heuristics propose for the
// shape, precision and a 32 MiB workspace, each timed with CUDA events; the fastest one is the
// reference a benchmark holds troupe's own GEMM against. The problem is posed as the backend
// poses it (row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T, fp32 operands and
// output, the precision's compute type), so the two compute exactly the same product.

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "layers/cuda/cuda_backend.h"
#include "layers/cuda/cuda_gemm.cuh"
#include "layers/cuda/cuda_kernels.cuh"

namespace troupe::layers {
namespace {

constexpr int requested_algorithms = 32;

/// Everything one search owns, released in the destructor.
struct search_state {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;

  ~search_state() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (workspace) cudaFree(workspace);
    if (handle) cublasLtDestroy(handle);
  }
};

}  // namespace

library_gemm_timing cuda_best_library_gemm(int device, stream s, math_precision precision,
                                           transpose transpose_a, transpose transpose_b, int m,
                                           int n, int k, const float* a, int lda, const float* b,
                                           int ldb, float* c, int ldc, int repeats) {
  library_gemm_timing result;
  if (m <= 0 || n <= 0 || k <= 0 || repeats <= 0) return result;
  TROUPE_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t cs = static_cast<cudaStream_t>(s.handle);
  search_state state;
  TROUPE_CUBLAS_CHECK(cublasLtCreate(&state.handle));
  TROUPE_CUDA_CHECK(cudaMalloc(&state.workspace, cuda_gemm::workspace_bytes));
  TROUPE_CUDA_CHECK(cudaEventCreate(&state.start));
  TROUPE_CUDA_CHECK(cudaEventCreate(&state.stop));
  const cuda_gemm::gemm_problem problem(precision, CUDA_R_32F, transpose_a, transpose_b, m, n, k,
                                        lda, ldb, ldc);
  for (const auto& algorithm : problem.candidates(state.handle, requested_algorithms)) {
    const double seconds = problem.time(state.handle, cs, algorithm, a, b, c, state.workspace,
                                        repeats, state.start, state.stop);
    if (seconds <= 0) continue;  // an algorithm may refuse
    ++result.algorithms;
    if (result.seconds == 0 || seconds < result.seconds) result.seconds = seconds;
  }
  return result;
}

}  // namespace troupe::layers
