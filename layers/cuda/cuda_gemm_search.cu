// cuBLAS's best for one GEMM shape: every algorithm that cuBLASLt's heuristics propose for the
// shape, precision and a 32 MiB workspace, each timed with CUDA events; the fastest one is the
// reference a benchmark holds troupe's own GEMM against. The problem is posed as the backend
// poses it (row-major C = op(A) op(B) as column-major C^T = op(B)^T op(A)^T, fp32 operands and
// output, the precision's compute type), so the two compute exactly the same product.

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "layers/cuda/cuda_backend.h"
#include "layers/cuda/cuda_kernels.cuh"

namespace troupe::layers {
namespace {

constexpr size_t workspace_bytes = size_t(32) << 20;
constexpr int requested_algorithms = 32;

cublasComputeType_t compute_type(math_precision precision) {
  switch (precision) {
    case math_precision::tf32:
      return CUBLAS_COMPUTE_32F_FAST_TF32;
    case math_precision::bf16:
      return CUBLAS_COMPUTE_32F_FAST_16BF;
    default:
      return CUBLAS_COMPUTE_32F;
  }
}

cublasOperation_t to_operation(transpose t) {
  return t == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/// The column-major layout of a row-major matrix that op() turns into rows × cols (of the
/// column-major problem) with row stride `leading`.
cublasLtMatrixLayout_t layout(transpose t, int rows, int cols, int leading) {
  cublasLtMatrixLayout_t result = nullptr;
  const bool plain = t == transpose::no;
  TROUPE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&result, CUDA_R_32F, plain ? rows : cols,
                                                 plain ? cols : rows, leading));
  return result;
}

/// Everything one search owns, released in the destructor.
struct search_state {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  void* workspace = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;

  ~search_state() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (workspace) cudaFree(workspace);
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    for (auto* l : {a, b, c})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (operation) cublasLtMatmulDescDestroy(operation);
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
  TROUPE_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&state.operation, compute_type(precision), CUDA_R_32F));
  // The column-major problem: M = n, N = m; its A is our B and its B our A.
  const cublasOperation_t operation_a = to_operation(transpose_b),
                          operation_b = to_operation(transpose_a);
  TROUPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(state.operation, CUBLASLT_MATMUL_DESC_TRANSA,
                                                     &operation_a, sizeof(operation_a)));
  TROUPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(state.operation, CUBLASLT_MATMUL_DESC_TRANSB,
                                                     &operation_b, sizeof(operation_b)));
  state.a = layout(transpose_b, n, k, ldb);
  state.b = layout(transpose_a, k, m, lda);
  state.c = layout(transpose::no, n, m, ldc);
  TROUPE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&state.preference));
  size_t workspace = workspace_bytes;
  TROUPE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      state.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  TROUPE_CUDA_CHECK(cudaMalloc(&state.workspace, workspace_bytes));
  TROUPE_CUDA_CHECK(cudaEventCreate(&state.start));
  TROUPE_CUDA_CHECK(cudaEventCreate(&state.stop));

  std::vector<cublasLtMatmulHeuristicResult_t> candidates(requested_algorithms);
  int found = 0;
  if (cublasLtMatmulAlgoGetHeuristic(state.handle, state.operation, state.a, state.b, state.c,
                                     state.c, state.preference, requested_algorithms,
                                     candidates.data(), &found) != CUBLAS_STATUS_SUCCESS)
    return result;
  const float alpha = 1.0f, beta = 0.0f;
  for (int i = 0; i < found; ++i) {
    if (candidates[i].state != CUBLAS_STATUS_SUCCESS) continue;
    auto run = [&] {
      return cublasLtMatmul(state.handle, state.operation, &alpha, b, state.a, a, state.b, &beta, c,
                            state.c, c, state.c, &candidates[i].algo, state.workspace,
                            workspace_bytes, cs);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // the warm-up; an algorithm may refuse
    TROUPE_CUDA_CHECK(cudaEventRecord(state.start, cs));
    bool failed = false;
    for (int r = 0; r < repeats && !failed; ++r) failed = run() != CUBLAS_STATUS_SUCCESS;
    TROUPE_CUDA_CHECK(cudaEventRecord(state.stop, cs));
    TROUPE_CUDA_CHECK(cudaEventSynchronize(state.stop));
    if (failed) continue;
    float milliseconds = 0;
    TROUPE_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, state.start, state.stop));
    const double seconds = milliseconds / 1e3 / repeats;
    ++result.algorithms;
    if (result.seconds == 0 || seconds < result.seconds) result.seconds = seconds;
  }
  return result;
}

}  // namespace troupe::layers
