#pragma once

// Private to layers/cuda/: GEMMs through cuBLASLt, as the backend poses them (row-major
// C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so cuBLASLt's A is our B).
//
// gemm_problem describes one shape, precision and operand type to cuBLASLt and times its
// algorithms; the benchmarks' "cuBLAS's best" (cuda_gemm_search.cu) and the backend's own
// GEMMs (gemm_runner) both use it, so both pose exactly the same product.
//
// gemm_runner is what backend::gemm calls. The first GEMM of each shape (sizes, transposes,
// leading dimensions, precision) times every algorithm cuBLASLt's heuristics propose and keeps
// the fastest for every later GEMM of that shape in the process (TROUPE_GEMM_SEARCH=off keeps
// the heuristics' first instead, the same on every run). An algorithm computes the same bits
// every time it runs, so runs in one process stay bit-reproducible; a choice made by timing
// can differ between processes. At bf16 the runner rounds both operands to bfloat16 (to
// nearest, ties to even, as the CPU backend does) into packed scratch copies and multiplies
// those with fp32 sums and output, which runs at the tensor cores' bf16 rate.

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "layers/backend.h"

namespace troupe::layers::cuda_gemm {

/// The cuBLASLt workspace each stream gets.
constexpr size_t workspace_bytes = size_t(32) << 20;

/// One GEMM shape described to cuBLASLt: operands of `operand_type` (CUDA_R_32F, or
/// CUDA_R_16BF), fp32 output and scale, `precision`'s compute type.
class gemm_problem {
 public:
  gemm_problem(cublasLtHandle_t handle, math_precision precision, cudaDataType operand_type,
               transpose transpose_a, transpose transpose_b, int m, int n, int k, int lda, int ldb,
               int ldc);
  ~gemm_problem();
  gemm_problem(const gemm_problem&) = delete;
  gemm_problem& operator=(const gemm_problem&) = delete;

  /// Up to `count` algorithms that cuBLASLt's heuristics propose, in their order.
  std::vector<cublasLtMatmulAlgo_t> candidates(int count) const;
  /// C = alpha op(A) op(B) + beta C with `algorithm`, enqueued on `s`.
  cublasStatus_t run(cudaStream_t s, const cublasLtMatmulAlgo_t& algorithm, float alpha,
                     const void* a, const void* b, float beta, float* c, void* workspace) const;
  /// Seconds per call of `algorithm` (beta 0, into `c`) over `repeats` calls between `start`
  /// and `stop` after one warm-up; negative when the algorithm refuses the problem. Blocks.
  double time(cudaStream_t s, const cublasLtMatmulAlgo_t& algorithm, const void* a, const void* b,
              float* c, void* workspace, int repeats, cudaEvent_t start, cudaEvent_t stop) const;

 private:
  cublasLtHandle_t handle_;
  cublasLtMatmulDesc_t operation_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;  // cuBLASLt's A, B, C
  cublasLtMatmulPreference_t preference_ = nullptr;
};

/// The backend's GEMMs: one chosen algorithm per shape, searched on first use.
class gemm_runner {
 public:
  /// For the device current on the calling thread; scratch comes from `scratch_pool`.
  explicit gemm_runner(cudaMemPool_t scratch_pool);
  ~gemm_runner();
  gemm_runner(const gemm_runner&) = delete;
  gemm_runner& operator=(const gemm_runner&) = delete;

  /// C = alpha op(A) op(B) + beta C on `s` (arguments validated by the caller, m, n, k > 0),
  /// with `workspace` holding workspace_bytes that only `s` uses.
  void gemm(cudaStream_t s, void* workspace, math_precision precision, transpose transpose_a,
            transpose transpose_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc);

 private:
  struct shape {
    int precision, transpose_a, transpose_b, m, n, k, lda, ldb, ldc;
    bool operator==(const shape& other) const;
  };
  struct shape_hash {
    size_t operator()(const shape& s) const;
  };
  struct plan {
    std::unique_ptr<gemm_problem> problem;
    cublasLtMatmulAlgo_t algorithm;
  };

  /// The plan of `key`, searched on `s` on first use (A, B as the GEMM will read them).
  const plan& plan_for(const shape& key, cudaStream_t s, void* workspace, const void* a,
                       const void* b);
  void* allocate(cudaStream_t s, size_t bytes);

  cudaMemPool_t scratch_pool_;
  cublasLtHandle_t handle_ = nullptr;
  bool search_ = true;
  std::mutex mutex_;  // guards plans_: stages call from their own threads
  std::unordered_map<shape, std::unique_ptr<plan>, shape_hash> plans_;
};

}  // namespace troupe::layers::cuda_gemm
