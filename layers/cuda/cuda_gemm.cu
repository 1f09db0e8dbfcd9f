// GEMMs through cuBLASLt: the problem description, the timing of its algorithms and the
// backend's runner, which searches each shape once (see cuda_gemm.cuh).

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "layers/cuda/cuda_gemm.cuh"
#include "layers/cuda/cuda_kernels.cuh"

namespace troupe::layers::cuda_gemm {
namespace {

constexpr int requested_algorithms = 32;
constexpr int search_repeats = 3;
/// Among algorithms within this fraction of the fastest, the search keeps the heuristics'
/// earliest, so that timing noise rarely changes the choice.
constexpr double search_tie = 0.03;

cublasComputeType_t compute_type(math_precision precision, cudaDataType operand_type) {
  if (operand_type == CUDA_R_16BF) return CUBLAS_COMPUTE_32F;  // the operands are bf16 already
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
cublasLtMatrixLayout_t layout(cudaDataType type, transpose t, int rows, int cols, int leading) {
  cublasLtMatrixLayout_t result = nullptr;
  const bool plain = t == transpose::no;
  TROUPE_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&result, type, plain ? rows : cols, plain ? cols : rows, leading));
  return result;
}

/// out = in rounded to bfloat16 (to nearest, ties to even), a rows × cols block of row stride
/// `ld` packed into rows × cols.
__global__ void pack_bfloat16(const float* in, int rows, int cols, int ld, __nv_bfloat16* out) {
  const size_t count = size_t(rows) * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count;
       i += size_t(gridDim.x) * blockDim.x) {
    const size_t row = i / cols, col = i % cols;
    out[i] = __float2bfloat16_rn(in[row * ld + col]);
  }
}

/// The same for a packed block (ld == cols) of a multiple of 4 elements at 16-byte alignment:
/// four at a time.
__global__ void pack_bfloat16_vectors(const float4* in, size_t vectors, __nv_bfloat162* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < vectors;
       i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = in[i];
    out[2 * i] = __floats2bfloat162_rn(v.x, v.y);
    out[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
  }
}

void pack(cudaStream_t s, const float* in, int rows, int cols, int ld, __nv_bfloat16* out) {
  constexpr int threads = 256, most_blocks = 4096;
  const size_t count = size_t(rows) * cols;
  if (ld == cols && count % 4 == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0) {
    const size_t vectors = count / 4;
    const int blocks = int(std::min<size_t>((vectors + threads - 1) / threads, most_blocks));
    pack_bfloat16_vectors<<<blocks, threads, 0, s>>>(reinterpret_cast<const float4*>(in), vectors,
                                                     reinterpret_cast<__nv_bfloat162*>(out));
  } else {
    const int blocks = int(std::min<size_t>((count + threads - 1) / threads, most_blocks));
    pack_bfloat16<<<blocks, threads, 0, s>>>(in, rows, cols, ld, out);
  }
  TROUPE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// ---- gemm_problem -----------------------------------------------------------------------------

gemm_problem::gemm_problem(cublasLtHandle_t handle, math_precision precision,
                           cudaDataType operand_type, transpose transpose_a, transpose transpose_b,
                           int m, int n, int k, int lda, int ldb, int ldc)
    : handle_(handle) {
  TROUPE_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&operation_, compute_type(precision, operand_type), CUDA_R_32F));
  // The column-major problem: M = n, N = m; its A is our B and its B our A.
  const cublasOperation_t operation_a = to_operation(transpose_b),
                          operation_b = to_operation(transpose_a);
  TROUPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation_, CUBLASLT_MATMUL_DESC_TRANSA,
                                                     &operation_a, sizeof(operation_a)));
  TROUPE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation_, CUBLASLT_MATMUL_DESC_TRANSB,
                                                     &operation_b, sizeof(operation_b)));
  a_ = layout(operand_type, transpose_b, n, k, ldb);
  b_ = layout(operand_type, transpose_a, k, m, lda);
  c_ = layout(CUDA_R_32F, transpose::no, n, m, ldc);
  TROUPE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference_));
  size_t workspace = workspace_bytes;
  TROUPE_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      preference_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
}

gemm_problem::~gemm_problem() {
  if (preference_) cublasLtMatmulPreferenceDestroy(preference_);
  for (auto* l : {a_, b_, c_})
    if (l) cublasLtMatrixLayoutDestroy(l);
  if (operation_) cublasLtMatmulDescDestroy(operation_);
}

std::vector<cublasLtMatmulAlgo_t> gemm_problem::candidates(int count) const {
  std::vector<cublasLtMatmulHeuristicResult_t> results(count);
  int found = 0;
  std::vector<cublasLtMatmulAlgo_t> algorithms;
  if (cublasLtMatmulAlgoGetHeuristic(handle_, operation_, a_, b_, c_, c_, preference_, count,
                                     results.data(), &found) != CUBLAS_STATUS_SUCCESS)
    return algorithms;
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algorithms.push_back(results[i].algo);
  return algorithms;
}

cublasStatus_t gemm_problem::run(cudaStream_t s, const cublasLtMatmulAlgo_t& algorithm, float alpha,
                                 const void* a, const void* b, float beta, float* c,
                                 void* workspace) const {
  // cuBLASLt's A is our B.
  return cublasLtMatmul(handle_, operation_, &alpha, b, a_, a, b_, &beta, c, c_, c, c_, &algorithm,
                        workspace, workspace_bytes, s);
}

double gemm_problem::time(cudaStream_t s, const cublasLtMatmulAlgo_t& algorithm, const void* a,
                          const void* b, float* c, void* workspace, int repeats, cudaEvent_t start,
                          cudaEvent_t stop) const {
  if (run(s, algorithm, 1.0f, a, b, 0.0f, c, workspace) != CUBLAS_STATUS_SUCCESS) return -1;
  TROUPE_CUDA_CHECK(cudaEventRecord(start, s));
  bool failed = false;
  for (int r = 0; r < repeats && !failed; ++r)
    failed = run(s, algorithm, 1.0f, a, b, 0.0f, c, workspace) != CUBLAS_STATUS_SUCCESS;
  TROUPE_CUDA_CHECK(cudaEventRecord(stop, s));
  TROUPE_CUDA_CHECK(cudaEventSynchronize(stop));
  if (failed) return -1;
  float milliseconds = 0;
  TROUPE_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, stop));
  return milliseconds / 1e3 / repeats;
}

// ---- gemm_runner ------------------------------------------------------------------------------

bool gemm_runner::shape::operator==(const shape& o) const {
  return std::memcmp(this, &o, sizeof(shape)) == 0;
}

size_t gemm_runner::shape_hash::operator()(const shape& s) const {
  size_t hash = 0;
  for (int field : {s.precision, s.transpose_a, s.transpose_b, s.m, s.n, s.k, s.lda, s.ldb, s.ldc})
    hash = hash * 1000003u ^ std::hash<int>()(field);
  return hash;
}

gemm_runner::gemm_runner(cudaMemPool_t scratch_pool) : scratch_pool_(scratch_pool) {
  TROUPE_CUBLAS_CHECK(cublasLtCreate(&handle_));
  const char* setting = std::getenv("TROUPE_GEMM_SEARCH");
  search_ = setting == nullptr || std::strcmp(setting, "off") != 0;
}

gemm_runner::~gemm_runner() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

void* gemm_runner::allocate(cudaStream_t s, size_t bytes) {
  void* pointer = nullptr;
  const cudaError_t status = cudaMallocFromPoolAsync(&pointer, bytes, scratch_pool_, s);
  if (status == cudaErrorMemoryAllocation) {
    std::fprintf(stderr, "troupe: out of device memory allocating %zu bytes of GEMM scratch\n",
                 bytes);
    std::abort();
  }
  TROUPE_CUDA_CHECK(status);
  return pointer;
}

const gemm_runner::plan& gemm_runner::plan_for(const shape& key, cudaStream_t s, void* workspace,
                                               const void* a, const void* b) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = plans_.find(key);
  if (found != plans_.end()) return *found->second;
  const auto precision = static_cast<math_precision>(key.precision);
  const auto transpose_a = static_cast<transpose>(key.transpose_a),
             transpose_b = static_cast<transpose>(key.transpose_b);
  auto result = std::make_unique<plan>();
  result->problem = std::make_unique<gemm_problem>(
      handle_, precision, precision == math_precision::bf16 ? CUDA_R_16BF : CUDA_R_32F, transpose_a,
      transpose_b, key.m, key.n, key.k, key.lda, key.ldb, key.ldc);
  const auto candidates = result->problem->candidates(search_ ? requested_algorithms : 1);
  if (candidates.empty()) {
    std::fprintf(stderr, "troupe: cuBLASLt proposes no algorithm for a %dx%dx%d GEMM\n", key.m,
                 key.n, key.k);
    std::abort();
  }
  result->algorithm = candidates.front();
  if (candidates.size() > 1) {
    // Timed into scratch, never into C, whose old values a GEMM with beta != 0 still needs.
    float* c = static_cast<float*>(allocate(s, size_t(key.m) * key.ldc * sizeof(float)));
    cudaEvent_t start = nullptr, stop = nullptr;
    TROUPE_CUDA_CHECK(cudaEventCreate(&start));
    TROUPE_CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<double> seconds;
    for (const auto& algorithm : candidates)
      seconds.push_back(
          result->problem->time(s, algorithm, a, b, c, workspace, search_repeats, start, stop));
    double fastest = -1;
    for (double t : seconds)
      if (t > 0 && (fastest < 0 || t < fastest)) fastest = t;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (seconds[i] > 0 && seconds[i] <= fastest * (1 + search_tie)) {
        result->algorithm = candidates[i];
        break;
      }
    }
    TROUPE_CUDA_CHECK(cudaEventDestroy(start));
    TROUPE_CUDA_CHECK(cudaEventDestroy(stop));
    TROUPE_CUDA_CHECK(cudaFreeAsync(c, s));
  }
  return *plans_.emplace(key, std::move(result)).first->second;
}

void gemm_runner::gemm(cudaStream_t s, void* workspace, math_precision precision,
                       transpose transpose_a, transpose transpose_b, int m, int n, int k,
                       float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                       float* c, int ldc) {
  // Row-major op(A) is m × k: stored as m × k, or as k × m when transposed.
  const int a_rows = transpose_a == transpose::no ? m : k,
            a_cols = transpose_a == transpose::no ? k : m;
  const int b_rows = transpose_b == transpose::no ? k : n,
            b_cols = transpose_b == transpose::no ? n : k;
  const void* a_operand = a;
  const void* b_operand = b;
  void* packed = nullptr;
  if (precision == math_precision::bf16) {
    const size_t a_count = size_t(a_rows) * a_cols, b_count = size_t(b_rows) * b_cols;
    const size_t a_bytes = (a_count * sizeof(__nv_bfloat16) + 255) / 256 * 256;
    packed = allocate(s, a_bytes + b_count * sizeof(__nv_bfloat16));
    auto* a_packed = static_cast<__nv_bfloat16*>(packed);
    auto* b_packed = reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(packed) + a_bytes);
    pack(s, a, a_rows, a_cols, lda, a_packed);
    pack(s, b, b_rows, b_cols, ldb, b_packed);
    a_operand = a_packed;
    b_operand = b_packed;
    lda = a_cols;
    ldb = b_cols;
  }
  const shape key{static_cast<int>(precision),
                  static_cast<int>(transpose_a),
                  static_cast<int>(transpose_b),
                  m,
                  n,
                  k,
                  lda,
                  ldb,
                  ldc};
  const plan& chosen = plan_for(key, s, workspace, a_operand, b_operand);
  TROUPE_CUBLAS_CHECK(
      chosen.problem->run(s, chosen.algorithm, alpha, a_operand, b_operand, beta, c, workspace));
  if (packed != nullptr) TROUPE_CUDA_CHECK(cudaFreeAsync(packed, s));
}

}  // namespace troupe::layers::cuda_gemm
