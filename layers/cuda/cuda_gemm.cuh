#pragma once

// Private to layers/cuda/: GEMMs through cuBLASLt, as the backend poses them (row-major
// C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so cuBLASLt's A is our B).
//
// gemm_problem describes one shape, precision and operand type to cuBLASLt and times its
// algorithms; the benchmarks' "cuBLAS's best" (cuda_gemm_search.cu) and the backend's own
// GEMMs (gemm_runner) both use it, so both pose exactly the same product.
//
// gemm_runner is what backend::gemm calls. The first GEMM of each shape (sizes, transposes,
// leading dimensions, precision) on a device times the algorithms cuBLASLt's heuristics
// propose and keeps the fastest for every later GEMM of that shape on that device in the
// process, whichever backend or stage runs it (TROUPE_GEMM_SEARCH=off keeps the heuristics'
// first instead, the same on every run). An algorithm computes the same bits every time it
// runs, so runs in one process stay bit-reproducible; a choice made by timing can differ
// between processes. At bf16 the runner either rounds both operands to bfloat16 (to nearest,
// ties to even, as the CPU backend does) into packed scratch copies and multiplies those, at
// the tensor cores' bf16 rate, or hands cuBLASLt the fp32 operands with its FAST_16BF compute
// type, whichever the search found faster counting the packing (the second wins only where
// packing costs more than the product, as with 10 output columns); sums and output are fp32.

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "layers/backend.h"

namespace troupe::layers::cuda_gemm {

/// The cuBLASLt workspace each stream gets.
constexpr size_t workspace_bytes = size_t(32) << 20;

/// One GEMM shape described to cuBLASLt: operands of `operand_type` (CUDA_R_32F, or
/// CUDA_R_16BF), fp32 output and scale, `precision`'s compute type. Holds no handle, so any
/// cuBLASLt handle on the device may run it.
class gemm_problem {
 public:
  gemm_problem(math_precision precision, cudaDataType operand_type, transpose transpose_a,
               transpose transpose_b, int m, int n, int k, int lda, int ldb, int ldc);
  ~gemm_problem();
  gemm_problem(const gemm_problem&) = delete;
  gemm_problem& operator=(const gemm_problem&) = delete;

  /// Up to `count` algorithms that cuBLASLt's heuristics propose, in their order.
  std::vector<cublasLtMatmulAlgo_t> candidates(cublasLtHandle_t handle, int count) const;
  /// C = alpha op(A) op(B) + beta C with `algorithm`, enqueued on `s`.
  cublasStatus_t run(cublasLtHandle_t handle, cudaStream_t s, const cublasLtMatmulAlgo_t& algorithm,
                     float alpha, const void* a, const void* b, float beta, float* c,
                     void* workspace) const;
  /// Seconds per call of `algorithm` (beta 0, into `c`) over `repeats` calls between `start`
  /// and `stop` after one warm-up; negative when the algorithm refuses the problem. Blocks.
  double time(cublasLtHandle_t handle, cudaStream_t s, const cublasLtMatmulAlgo_t& algorithm,
              const void* a, const void* b, float* c, void* workspace, int repeats,
              cudaEvent_t start, cudaEvent_t stop) const;

 private:
  cublasLtMatmulDesc_t operation_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;  // cuBLASLt's A, B, C
  cublasLtMatmulPreference_t preference_ = nullptr;
};

/// The backend's GEMMs: one chosen algorithm per shape and device, searched on first use.
class gemm_runner {
 public:
  /// For CUDA device `device`; scratch comes from `scratch_pool`.
  gemm_runner(int device, cudaMemPool_t scratch_pool);
  ~gemm_runner();
  gemm_runner(const gemm_runner&) = delete;
  gemm_runner& operator=(const gemm_runner&) = delete;

  /// C = alpha op(A) op(B) + beta C on `s` (arguments validated by the caller, m, n, k > 0),
  /// with `workspace` holding workspace_bytes that only `s` uses.
  void gemm(cudaStream_t s, void* workspace, math_precision precision, transpose transpose_a,
            transpose transpose_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc);

  struct shape;
  struct plan;

 private:
  struct operands;

  /// The plan of `key`, searched on `s` on first use (with A and B as the GEMM reads them).
  const plan& plan_for(const shape& key, cudaStream_t s, void* workspace, const float* a,
                       const float* b);
  /// A and B packed to bfloat16 when `packed`, else as they are.
  operands prepare(cudaStream_t s, bool packed, const shape& key, const float* a, const float* b);
  void* allocate(cudaStream_t s, size_t bytes);

  int device_;
  cudaMemPool_t scratch_pool_;
  cublasLtHandle_t handle_ = nullptr;
  bool search_ = true;
};

}  // namespace troupe::layers::cuda_gemm
