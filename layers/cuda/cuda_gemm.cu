// GEMMs through cuBLASLt: the problem description, the timing of its algorithms and the
// backend's runner, which searches each shape once (see cuda_gemm.cuh).

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "layers/cuda/cuda_gemm.cuh"
#include "layers/cuda/cuda_kernels.cuh"

namespace troupe::layers::cuda_gemm {
namespace {

constexpr int requested_algorithms = 32;
constexpr int search_repeats = 3;
/// A GEMM shorter than this is timed over enough calls to fill it: one call of a few tens of
/// microseconds is within launch jitter of its rivals.
constexpr double search_window_s = 200e-6;
constexpr int search_max_calls = 50;
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

gemm_problem::gemm_problem(math_precision precision, cudaDataType operand_type,
                           transpose transpose_a, transpose transpose_b, int m, int n, int k,
                           int lda, int ldb, int ldc) {
  TROUPE_CUBLAS_CHECK(
      cublasLtMatmulDescCreate(&operation_, compute_type(precision, operand_type), CUDA_R_32F));
  // The column-major problem: M = n, N = m; its A is our B and its B our A.
  const cublasOperation_t operation_a = to_cublas(transpose_b),
                          operation_b = to_cublas(transpose_a);
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

std::vector<cublasLtMatmulAlgo_t> gemm_problem::candidates(cublasLtHandle_t handle,
                                                           int count) const {
  std::vector<cublasLtMatmulHeuristicResult_t> results(count);
  int found = 0;
  std::vector<cublasLtMatmulAlgo_t> algorithms;
  if (cublasLtMatmulAlgoGetHeuristic(handle, operation_, a_, b_, c_, c_, preference_, count,
                                     results.data(), &found) != CUBLAS_STATUS_SUCCESS)
    return algorithms;
  for (int i = 0; i < found; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algorithms.push_back(results[i].algo);
  return algorithms;
}

cublasStatus_t gemm_problem::run(cublasLtHandle_t handle, cudaStream_t s,
                                 const cublasLtMatmulAlgo_t& algorithm, float alpha, const void* a,
                                 const void* b, float beta, float* c, void* workspace) const {
  // cuBLASLt's A is our B.
  return cublasLtMatmul(handle, operation_, &alpha, b, a_, a, b_, &beta, c, c_, c, c_, &algorithm,
                        workspace, workspace_bytes, s);
}

double gemm_problem::time(cublasLtHandle_t handle, cudaStream_t s,
                          const cublasLtMatmulAlgo_t& algorithm, const void* a, const void* b,
                          float* c, void* workspace, int repeats, cudaEvent_t start,
                          cudaEvent_t stop) const {
  auto call = [&] { return run(handle, s, algorithm, 1.0f, a, b, 0.0f, c, workspace); };
  if (call() != CUBLAS_STATUS_SUCCESS) return -1;
  TROUPE_CUDA_CHECK(cudaEventRecord(start, s));
  bool failed = false;
  for (int r = 0; r < repeats && !failed; ++r) failed = call() != CUBLAS_STATUS_SUCCESS;
  TROUPE_CUDA_CHECK(cudaEventRecord(stop, s));
  TROUPE_CUDA_CHECK(cudaEventSynchronize(stop));
  if (failed) return -1;
  float milliseconds = 0;
  TROUPE_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, stop));
  return milliseconds / 1e3 / repeats;
}

// ---- gemm_runner ------------------------------------------------------------------------------

struct gemm_runner::shape {
  int device, precision, transpose_a, transpose_b, m, n, k, lda, ldb, ldc;

  bool operator==(const shape& o) const { return std::memcmp(this, &o, sizeof(shape)) == 0; }
  transpose op_a() const { return static_cast<transpose>(transpose_a); }
  transpose op_b() const { return static_cast<transpose>(transpose_b); }
  // Row-major op(A) is m × k: stored as m × k, or as k × m when transposed; op(B) likewise.
  int a_rows() const { return op_a() == transpose::no ? m : k; }
  int a_columns() const { return op_a() == transpose::no ? k : m; }
  int b_rows() const { return op_b() == transpose::no ? k : n; }
  int b_columns() const { return op_b() == transpose::no ? n : k; }

  /// The problem cuBLASLt solves: on packed bfloat16 copies (rows apart by their columns), or
  /// on the operands as they are.
  std::unique_ptr<gemm_problem> problem(bool packed) const {
    return std::make_unique<gemm_problem>(
        static_cast<math_precision>(precision), packed ? CUDA_R_16BF : CUDA_R_32F, op_a(), op_b(),
        m, n, k, packed ? a_columns() : lda, packed ? b_columns() : ldb, ldc);
  }
};

struct gemm_runner::plan {
  bool packed = false;
  std::unique_ptr<gemm_problem> problem;
  cublasLtMatmulAlgo_t algorithm;
};

struct gemm_runner::operands {
  const void* a;
  const void* b;
  void* scratch = nullptr;  // the packed copies, freed after the GEMM
};

namespace {

struct shape_hash {
  size_t operator()(const gemm_runner::shape& s) const {
    size_t hash = 0;
    for (int field :
         {s.device, s.precision, s.transpose_a, s.transpose_b, s.m, s.n, s.k, s.lda, s.ldb, s.ldc})
      hash = hash * 1000003u ^ std::hash<int>()(field);
    return hash;
  }
};

/// Every plan of the process, shared by the backends of a device (stages and their streams
/// call from their own threads). Never destroyed: backends may outlive static destruction.
std::mutex plans_mutex;
auto& plans =
    *new std::unordered_map<gemm_runner::shape, std::unique_ptr<gemm_runner::plan>, shape_hash>();

/// The best of a problem's algorithms by timing: each candidate over enough calls to fill
/// search_window_s after a warm-up, then the three fastest three times as many calls again;
/// among those within search_tie of the fastest, the heuristics' earliest. Seconds per call;
/// negative when every candidate refused.
struct timed_choice {
  cublasLtMatmulAlgo_t algorithm;
  double seconds = -1;
};

timed_choice fastest(cublasLtHandle_t handle, const gemm_problem& problem,
                     const std::vector<cublasLtMatmulAlgo_t>& candidates, cudaStream_t s,
                     const void* a, const void* b, float* c, void* workspace, cudaEvent_t start,
                     cudaEvent_t stop) {
  std::vector<double> once;
  for (const auto& algorithm : candidates)
    once.push_back(problem.time(handle, s, algorithm, a, b, c, workspace, 1, start, stop));
  std::vector<size_t> order;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (once[i] > 0) order.push_back(i);
  if (order.empty()) return {};
  double quickest = once[order.front()];
  for (size_t i : order) quickest = std::min(quickest, once[i]);
  const int calls = std::max(
      1, std::min(search_max_calls, static_cast<int>(std::ceil(search_window_s / quickest))));
  if (calls > 1)
    for (size_t i : order)
      once[i] = problem.time(handle, s, candidates[i], a, b, c, workspace, calls, start, stop);
  order.erase(std::remove_if(order.begin(), order.end(), [&](size_t i) { return once[i] <= 0; }),
              order.end());
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return once[x] < once[y]; });
  order.resize(std::min<size_t>(order.size(), 3));
  std::sort(order.begin(), order.end());  // the heuristics' order again
  std::vector<double> again;
  for (size_t i : order)
    again.push_back(problem.time(handle, s, candidates[i], a, b, c, workspace,
                                 search_repeats * calls, start, stop));
  timed_choice best;
  for (double t : again)
    if (t > 0 && (best.seconds < 0 || t < best.seconds)) best.seconds = t;
  for (size_t j = 0; j < order.size(); ++j) {
    if (again[j] > 0 && again[j] <= best.seconds * (1 + search_tie)) {
      best.algorithm = candidates[order[j]];
      best.seconds = again[j];
      break;
    }
  }
  return best;
}

}  // namespace

gemm_runner::gemm_runner(int device, cudaMemPool_t scratch_pool)
    : device_(device), scratch_pool_(scratch_pool) {
  TROUPE_CUBLAS_CHECK(cublasLtCreate(&handle_));
  const char* setting = std::getenv("TROUPE_GEMM_SEARCH");
  search_ = setting == nullptr || std::strcmp(setting, "off") != 0;
}

gemm_runner::~gemm_runner() {
  if (handle_) cublasLtDestroy(handle_);
}

void* gemm_runner::allocate(cudaStream_t s, size_t bytes) {
  return allocate_on_stream(device_, scratch_pool_, s, bytes, "GEMM scratch");
}

gemm_runner::operands gemm_runner::prepare(cudaStream_t s, bool packed, const shape& key,
                                           const float* a, const float* b) {
  if (!packed) return {a, b};
  const size_t a_count = size_t(key.a_rows()) * key.a_columns();
  const size_t b_count = size_t(key.b_rows()) * key.b_columns();
  const size_t a_bytes = (a_count * sizeof(__nv_bfloat16) + 255) / 256 * 256;
  void* scratch = allocate(s, a_bytes + b_count * sizeof(__nv_bfloat16));
  auto* a_packed = static_cast<__nv_bfloat16*>(scratch);
  auto* b_packed = reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(scratch) + a_bytes);
  pack(s, a, key.a_rows(), key.a_columns(), key.lda, a_packed);
  pack(s, b, key.b_rows(), key.b_columns(), key.ldb, b_packed);
  return {a_packed, b_packed, scratch};
}

const gemm_runner::plan& gemm_runner::plan_for(const shape& key, cudaStream_t s, void* workspace,
                                               const float* a, const float* b) {
  std::lock_guard<std::mutex> lock(plans_mutex);
  auto found = plans.find(key);
  if (found != plans.end()) return *found->second;
  // At bf16 both ways of posing the product compete; otherwise only the operands as they are.
  std::vector<bool> ways = {false};
  if (static_cast<math_precision>(key.precision) == math_precision::bf16)
    ways = search_ ? std::vector<bool>{true, false} : std::vector<bool>{true};
  // Timed into scratch, never into C, whose old values a GEMM with beta != 0 still needs.
  float* c = static_cast<float*>(allocate(s, size_t(key.m) * key.ldc * sizeof(float)));
  cudaEvent_t start = nullptr, stop = nullptr;
  TROUPE_CUDA_CHECK(cudaEventCreate(&start));
  TROUPE_CUDA_CHECK(cudaEventCreate(&stop));
  std::unique_ptr<plan> best;
  double best_seconds = -1;
  for (bool packed : ways) {
    auto candidate = std::make_unique<plan>();
    candidate->packed = packed;
    candidate->problem = key.problem(packed);
    const auto algorithms =
        candidate->problem->candidates(handle_, search_ ? requested_algorithms : 1);
    if (algorithms.empty()) continue;
    candidate->algorithm = algorithms.front();
    double seconds = 0;
    if (search_) {
      // Packing counts: time it (the second time, once its kernels are loaded).
      double packing = 0;
      for (int round = 0; round < (packed ? 2 : 0); ++round) {
        TROUPE_CUDA_CHECK(cudaEventRecord(start, s));
        const operands packed_operands = prepare(s, true, key, a, b);
        TROUPE_CUDA_CHECK(cudaEventRecord(stop, s));
        TROUPE_CUDA_CHECK(cudaEventSynchronize(stop));
        float milliseconds = 0;
        TROUPE_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, stop));
        packing = milliseconds / 1e3;
        TROUPE_CUDA_CHECK(cudaFreeAsync(packed_operands.scratch, s));
      }
      const operands inputs = prepare(s, packed, key, a, b);
      const timed_choice choice = fastest(handle_, *candidate->problem, algorithms, s, inputs.a,
                                          inputs.b, c, workspace, start, stop);
      if (inputs.scratch != nullptr) TROUPE_CUDA_CHECK(cudaFreeAsync(inputs.scratch, s));
      if (choice.seconds < 0) continue;
      candidate->algorithm = choice.algorithm;
      seconds = choice.seconds + packing;
    }
    if (best == nullptr || seconds < best_seconds) {
      best = std::move(candidate);
      best_seconds = seconds;
    }
  }
  TROUPE_CUDA_CHECK(cudaEventDestroy(start));
  TROUPE_CUDA_CHECK(cudaEventDestroy(stop));
  TROUPE_CUDA_CHECK(cudaFreeAsync(c, s));
  if (best == nullptr) {
    std::fprintf(stderr, "troupe: cuBLASLt runs no algorithm for a %dx%dx%d GEMM\n", key.m, key.n,
                 key.k);
    std::abort();
  }
  return *plans.emplace(key, std::move(best)).first->second;
}

void gemm_runner::gemm(cudaStream_t s, void* workspace, math_precision precision,
                       transpose transpose_a, transpose transpose_b, int m, int n, int k,
                       float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                       float* c, int ldc) {
  const shape key{device_,
                  static_cast<int>(precision),
                  static_cast<int>(transpose_a),
                  static_cast<int>(transpose_b),
                  m,
                  n,
                  k,
                  lda,
                  ldb,
                  ldc};
  const plan& chosen = plan_for(key, s, workspace, a, b);
  const operands inputs = prepare(s, chosen.packed, key, a, b);
  TROUPE_CUBLAS_CHECK(chosen.problem->run(handle_, s, chosen.algorithm, alpha, inputs.a, inputs.b,
                                          beta, c, workspace));
  if (inputs.scratch != nullptr) TROUPE_CUDA_CHECK(cudaFreeAsync(inputs.scratch, s));
}

}  // namespace troupe::layers::cuda_gemm
