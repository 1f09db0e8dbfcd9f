// The CUDA + cuBLAS backend. Streams and events are cudaStream_t / cudaEvent_t cast to void*.
// Device memory comes from two stream-ordered pools owned by the backend: one for allocate()
// (allocated and freed on a private stream that carries no work, so a block is reused only
// after the caller has freed it, as the interface requires; freed blocks are kept by size and
// handed out again without a driver call, since a training step allocates the same shapes
// every time) and one for the short-lived scratch of reductions and GEMM operands (allocated
// and freed on the stream of the operation that uses it).
// GEMM goes through cuBLASLt (cuda_gemm.cuh: one algorithm per shape, chosen by timing on
// first use) with a workspace per stream, so concurrent stages never share one; batched GEMMs
// use one cuBLAS handle per stream for the same reason. The GEMM precision is kept per stream
// beside its handle: fp32 computes in plain fp32; tf32 uses the FAST_TF32 compute type on fp32
// operands; bf16 multiplies bfloat16 copies of the operands; products are summed in fp32.
//
// Threads: CAF runs a stage's handlers on any scheduler thread, so every operation makes the
// backend's device current (activate() or enter()) before its first CUDA or cuBLAS call.
//
// Pinned host memory (allocate_host) is kept for reuse once returned: cudaHostAlloc costs
// milliseconds and cudaFreeHost synchronizes the whole device, neither of which a message may
// pay. Blocks come in power-of-two sizes, so a stage that sends activations of one shape
// keeps taking back the same few blocks; they are freed when the backend goes.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "layers/check.h"
#include "layers/cuda/cuda_backend.h"
#include "layers/cuda/cuda_gemm.cuh"
#include "layers/cuda/cuda_kernels.cuh"

namespace troupe::layers {
namespace {

cudaStream_t to_cuda(stream s) { return static_cast<cudaStream_t>(s.handle); }
cudaEvent_t to_cuda(event e) { return static_cast<cudaEvent_t>(e.handle); }

cublasOperation_t to_cublas(transpose t) { return t == transpose::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

/// Whether `status` is success; otherwise says what failed on stderr and clears the error.
/// Used only while opening a device, where failure means "no backend", not a crash.
bool opened(cudaError_t status, int device, const char* what) {
  if (status == cudaSuccess) return true;
  std::fprintf(stderr, "troupe: cuda:%d: %s failed: %s\n", device, what,
               cudaGetErrorString(status));
  cudaGetLastError();
  return false;
}

/// A device-memory pool that keeps freed blocks for reuse instead of returning them to the
/// driver at every synchronization.
cudaError_t create_pool(int device, cudaMemPool_t* pool) {
  cudaMemPoolProps properties = {};
  properties.allocType = cudaMemAllocationTypePinned;
  properties.location.type = cudaMemLocationTypeDevice;
  properties.location.id = device;
  cudaError_t status = cudaMemPoolCreate(pool, &properties);
  if (status != cudaSuccess) return status;
  uint64_t keep_everything = UINT64_MAX;
  return cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReleaseThreshold, &keep_everything);
}

/// A cuBLAS handle bound to `s`, computing in plain fp32 (no TF32).
cublasStatus_t create_blas_handle(cudaStream_t s, cublasHandle_t* handle) {
  cublasStatus_t status = cublasCreate(handle);
  if (status != CUBLAS_STATUS_SUCCESS) return status;
  status = cublasSetStream(*handle, s);
  if (status == CUBLAS_STATUS_SUCCESS) status = cublasSetMathMode(*handle, CUBLAS_DEFAULT_MATH);
  if (status != CUBLAS_STATUS_SUCCESS) cublasDestroy(*handle);
  return status;
}

void check_geometry(const convolution_geometry& g) {
  TROUPE_CHECK(g.batch >= 0 && g.channels >= 0 && g.height >= 0 && g.width >= 0);
  TROUPE_CHECK(g.kernel > 0 && g.stride > 0 && g.padding >= 0);
  TROUPE_CHECK(g.out_height >= 0 && g.out_width >= 0);
}

/// Every window must start inside the image (windows are clipped at the far edges).
void check_geometry(const pooling_geometry& g) {
  TROUPE_CHECK(g.batch >= 0 && g.channels >= 0 && g.height >= 0 && g.width >= 0);
  TROUPE_CHECK(g.kernel > 0 && g.stride > 0 && g.out_height >= 0 && g.out_width >= 0);
  TROUPE_CHECK(g.out_height == 0 || (g.out_height - 1) * g.stride < g.height);
  TROUPE_CHECK(g.out_width == 0 || (g.out_width - 1) * g.stride < g.width);
}

class cuda_backend final : public backend {
 public:
  /// The backend on `device`, or null (with the reason on stderr) when it cannot be opened.
  static std::unique_ptr<backend> open(int device);
  ~cuda_backend() override;

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  device_kind kind() const override { return device_kind::cuda; }

  void* allocate(size_t bytes) override;
  void deallocate(void* pointer) override;
  void copy_host_to_device(stream s, void* device, const void* host, size_t bytes) override;
  void copy_device_to_host(stream s, void* host, const void* device, size_t bytes) override;
  void copy_device_to_device(stream s, void* target, const void* source, size_t bytes) override;
  void fill(stream s, float* data, float value, size_t count) override;
  void* allocate_host(size_t bytes) override;
  void deallocate_host(void* pointer) override;

  stream default_stream() override { return stream{default_stream_}; }
  stream create_stream() override;
  void destroy_stream(stream s) override;
  void synchronize(stream s) override;
  event create_event() override;
  void destroy_event(event e) override;
  void record_event(event e, stream s) override;
  void wait_event(stream s, event e) override;
  void synchronize_event(event e) override;
  void set_gemm_precision(stream s, math_precision precision) override;

  void gemm(stream s, transpose transpose_a, transpose transpose_b, int m, int n, int k,
            float alpha, const float* a, int lda, const float* b, int ldb, float beta, float* c,
            int ldc) override;
  void add_row_vector(stream s, float* matrix, const float* vector, int rows, int cols) override;
  void sum_rows(stream s, const float* matrix, int rows, int cols, float beta, float* out) override;
  void add_channel_vector(stream s, float* data, const float* vector, int batch, int channels,
                          int spatial) override;
  void sum_channels(stream s, const float* data, int batch, int channels, int spatial, float beta,
                    float* out) override;
  void transpose_batched(stream s, const float* in, float* out, int batch, int rows,
                         int cols) override;
  void axpy(stream s, float alpha, const float* x, float* y, size_t count) override;
  void multiply(stream s, const float* a, const float* b, float* out, size_t count) override;
  void sum(stream s, const float* x, size_t count, float* out) override;

  void gemm_batched(stream s, transpose transpose_a, transpose transpose_b, int m, int n, int k,
                    float alpha, const float* a, int lda, int64_t stride_a, const float* b, int ldb,
                    int64_t stride_b, float beta, float* c, int ldc, int64_t stride_c,
                    int batch) override;
  void layer_norm_forward(stream s, const float* x, const float* gamma, const float* beta, float* y,
                          float* normalized, float* rstd, int rows, int cols,
                          float epsilon) override {
    cuda_kernels::layer_norm_forward(enter(s), x, gamma, beta, y, normalized, rstd, rows, cols,
                                     epsilon);
  }
  void layer_norm_backward(stream s, const float* dy, const float* gamma, const float* normalized,
                           const float* rstd, float* dx, int rows, int cols) override {
    cuda_kernels::layer_norm_backward(enter(s), dy, gamma, normalized, rstd, dx, rows, cols);
  }
  void causal_softmax_forward(stream s, const float* scores, float* probabilities, int batch, int t,
                              float scale) override {
    cuda_kernels::causal_softmax_forward(enter(s), scores, probabilities, batch, t, scale);
  }
  void softmax_backward(stream s, const float* probabilities, const float* dp, float* dscores,
                        int rows, int cols, float scale) override {
    cuda_kernels::softmax_backward(enter(s), probabilities, dp, dscores, rows, cols, scale);
  }
  void embedding_forward(stream s, const float* ids, const float* table, float* out, int count,
                         int dim, int vocab) override {
    cuda_kernels::embedding_forward(enter(s), ids, table, out, count, dim, vocab);
  }
  void embedding_backward(stream s, const float* ids, const float* dout, float* table_gradient,
                          int count, int dim, int vocab, float beta) override {
    cuda_kernels::embedding_backward(enter(s), ids, dout, table_gradient, count, dim, vocab, beta);
  }

  void activation_forward(stream s, activation f, const float* x, float* y, size_t count) override;
  void activation_backward(stream s, activation f, const float* x, const float* y, const float* dy,
                           float* dx, size_t count) override;
  void softmax_cross_entropy(stream s, const float* logits, const int32_t* labels, int rows,
                             int cols, float gradient_scale, float* gradient, float* loss_sum,
                             float* correct) override;

  void im2col(stream s, const convolution_geometry& g, const float* image, float* columns) override;
  void col2im(stream s, const convolution_geometry& g, const float* columns, float* image) override;
  void max_pool_forward(stream s, const pooling_geometry& g, const float* x, float* y,
                        int32_t* argmax) override;
  void max_pool_backward(stream s, const pooling_geometry& g, const float* dy,
                         const int32_t* argmax, float* dx) override;

  void dropout_forward(stream s, const float* x, float* y, float* mask, size_t count,
                       float probability, uint64_t seed, uint64_t offset) override;

  void sgd_step(stream s, float* weights, const float* gradient, float* velocity, size_t count,
                const sgd_parameters& p) override;
  void adam_step(stream s, float* weights, const float* gradient, float* first_moment,
                 float* second_moment, size_t count, const adam_parameters& p) override;

 private:
  explicit cuda_backend(int device) : device_(device) {}
  bool initialize();

  /// Makes this backend's device current on the calling thread.
  void activate() const { TROUPE_CUDA_CHECK(cudaSetDevice(device_)); }
  /// activate(), then the CUDA stream of `s` (the default stream for a null handle).
  cudaStream_t enter(stream s) const {
    activate();
    return s.handle != nullptr ? to_cuda(s) : default_stream_;
  }
  /// What GEMMs on one stream use: its cuBLAS handle, cuBLASLt workspace and precision.
  struct stream_blas {
    cublasHandle_t handle = nullptr;
    void* workspace = nullptr;  // cuda_gemm::workspace_bytes
    math_precision precision = math_precision::fp32;
  };
  /// The entry of `s`, its handle created on first use; the caller holds blas_mutex_.
  stream_blas& blas_entry(cudaStream_t s);
  /// A copy of the entry of `s` (handle and precision), created on first use.
  stream_blas blas_for(cudaStream_t s);
  /// `count` floats of scratch usable on `s` until free_scratch(s, ...) (null when 0).
  float* allocate_scratch(cudaStream_t s, size_t count);
  /// Returns the freed blocks that allocate() keeps for reuse to the memory pool.
  void release_free_blocks();
  void free_scratch(cudaStream_t s, float* scratch);

  int device_;
  cudaStream_t default_stream_ = nullptr;
  cudaStream_t allocation_stream_ = nullptr;  // orders allocate() and deallocate(); no work
  cudaMemPool_t memory_pool_ = nullptr;
  cudaMemPool_t scratch_pool_ = nullptr;
  std::mutex blas_mutex_;  // guards blas_: stages call from their own threads
  std::unordered_map<cudaStream_t, stream_blas> blas_;
  std::unique_ptr<cuda_gemm::gemm_runner> gemm_runner_;
  std::mutex device_mutex_;  // guards the device blocks: tensors are freed from any thread
  std::unordered_map<void*, size_t> device_block_sizes_;               // every block handed out
  std::unordered_map<size_t, std::vector<void*>> free_device_blocks_;  // freed ones, by size
  std::mutex host_mutex_;  // guards the pinned blocks: frames return them from any thread
  std::unordered_map<void*, size_t> host_block_sizes_;               // every pinned block
  std::unordered_map<size_t, std::vector<void*>> free_host_blocks_;  // returned ones, by size
};

std::unique_ptr<backend> cuda_backend::open(int device) {
  std::unique_ptr<cuda_backend> result(new cuda_backend(device));
  if (!result->initialize()) return nullptr;
  return result;
}

bool cuda_backend::initialize() {
  int pools_supported = 0;
  if (!opened(cudaSetDevice(device_), device_, "cudaSetDevice") ||
      !opened(cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, device_),
              device_, "cudaDeviceGetAttribute")) {
    return false;
  }
  if (!pools_supported) {
    std::fprintf(stderr, "troupe: cuda:%d: the device has no stream-ordered memory pools\n",
                 device_);
    return false;
  }
  if (!opened(cudaStreamCreateWithFlags(&default_stream_, cudaStreamNonBlocking), device_,
              "cudaStreamCreateWithFlags") ||
      !opened(cudaStreamCreateWithFlags(&allocation_stream_, cudaStreamNonBlocking), device_,
              "cudaStreamCreateWithFlags") ||
      !opened(create_pool(device_, &memory_pool_), device_, "cudaMemPoolCreate") ||
      !opened(create_pool(device_, &scratch_pool_), device_, "cudaMemPoolCreate")) {
    return false;
  }
  cublasHandle_t handle = nullptr;
  cublasStatus_t status = create_blas_handle(default_stream_, &handle);
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "troupe: cuda:%d: cublasCreate failed: %s\n", device_,
                 cublasGetStatusString(status));
    return false;
  }
  blas_[default_stream_].handle = handle;
  gemm_runner_ = std::make_unique<cuda_gemm::gemm_runner>(device_, scratch_pool_);
  return true;
}

cuda_backend::~cuda_backend() {
  // Errors are ignored: at process exit the CUDA runtime may already be shutting down.
  // Streams a caller never destroyed may still run work that uses the handles and pools.
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  gemm_runner_.reset();
  for (const auto& entry : free_device_blocks_) {
    for (void* block : entry.second) cudaFreeAsync(block, allocation_stream_);
  }
  for (const auto& entry : blas_) {
    cublasDestroy(entry.second.handle);
    if (entry.second.workspace != nullptr) cudaFree(entry.second.workspace);
  }
  // Blocks still out (a contract violation) are left alone: someone may still read them.
  for (const auto& entry : free_host_blocks_) {
    for (void* block : entry.second) cudaFreeHost(block);
  }
  if (default_stream_ != nullptr) cudaStreamDestroy(default_stream_);
  if (allocation_stream_ != nullptr) cudaStreamDestroy(allocation_stream_);
  if (memory_pool_ != nullptr) cudaMemPoolDestroy(memory_pool_);
  if (scratch_pool_ != nullptr) cudaMemPoolDestroy(scratch_pool_);
}

cuda_backend::stream_blas& cuda_backend::blas_entry(cudaStream_t s) {
  stream_blas& entry = blas_[s];
  if (entry.handle == nullptr) TROUPE_CUBLAS_CHECK(create_blas_handle(s, &entry.handle));
  if (entry.workspace == nullptr)
    TROUPE_CUDA_CHECK(cudaMalloc(&entry.workspace, cuda_gemm::workspace_bytes));
  return entry;
}

cuda_backend::stream_blas cuda_backend::blas_for(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(blas_mutex_);
  return blas_entry(s);
}

// ---- memory ---------------------------------------------------------------------------------

void* cuda_backend::allocate(size_t bytes) {
  const size_t size = std::max<size_t>(bytes, 1);
  {
    // A block of this size freed before is reused without a call into the driver: a training
    // step allocates the same shapes every time.
    std::lock_guard<std::mutex> lock(device_mutex_);
    auto found = free_device_blocks_.find(size);
    if (found != free_device_blocks_.end() && !found->second.empty()) {
      void* pointer = found->second.back();
      found->second.pop_back();
      return pointer;
    }
  }
  activate();
  void* pointer = nullptr;
  cudaError_t status = cudaMallocFromPoolAsync(&pointer, size, memory_pool_, allocation_stream_);
  if (status == cudaErrorMemoryAllocation) {
    // The pools keep what they once used; hand the unused part and the kept blocks back to the
    // driver (which also undoes fragmentation) and retry once.
    cudaGetLastError();
    release_free_blocks();
    TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
    TROUPE_CUDA_CHECK(cudaMemPoolTrimTo(scratch_pool_, 0));
    TROUPE_CUDA_CHECK(cudaMemPoolTrimTo(memory_pool_, 0));
    status = cudaMallocFromPoolAsync(&pointer, size, memory_pool_, allocation_stream_);
  }
  if (status == cudaErrorMemoryAllocation) {
    std::fprintf(stderr, "troupe: %s: out of device memory allocating %zu bytes\n", name().c_str(),
                 bytes);
    std::abort();
  }
  TROUPE_CUDA_CHECK(status);
  // The allocation has completed once this returns, so any stream may use the memory.
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(allocation_stream_));
  TROUPE_CHECK(reinterpret_cast<uintptr_t>(pointer) % 64 == 0);
  std::lock_guard<std::mutex> lock(device_mutex_);
  device_block_sizes_[pointer] = size;
  return pointer;
}

void cuda_backend::deallocate(void* pointer) {
  if (pointer == nullptr) return;
  // Callers free a block once no work uses it, so it may be handed out again at once.
  std::lock_guard<std::mutex> lock(device_mutex_);
  auto found = device_block_sizes_.find(pointer);
  TROUPE_CHECK(found != device_block_sizes_.end());
  free_device_blocks_[found->second].push_back(pointer);
}

void cuda_backend::release_free_blocks() {
  activate();
  std::lock_guard<std::mutex> lock(device_mutex_);
  for (auto& entry : free_device_blocks_) {
    for (void* block : entry.second) {
      device_block_sizes_.erase(block);
      TROUPE_CUDA_CHECK(cudaFreeAsync(block, allocation_stream_));
    }
  }
  free_device_blocks_.clear();
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(allocation_stream_));
}

void* cuda_backend::allocate_host(size_t bytes) {
  size_t size = 4096;
  while (size < bytes) size *= 2;
  {
    std::lock_guard<std::mutex> lock(host_mutex_);
    std::vector<void*>& reusable = free_host_blocks_[size];
    if (!reusable.empty()) {
      void* block = reusable.back();
      reusable.pop_back();
      return block;
    }
  }
  activate();
  void* block = nullptr;
  // Portable: pinned for every device's context, whichever backend copies through it.
  const cudaError_t status = cudaHostAlloc(&block, size, cudaHostAllocPortable);
  if (status == cudaErrorMemoryAllocation) {
    std::fprintf(stderr, "troupe: %s: out of pinned host memory allocating %zu bytes\n",
                 name().c_str(), size);
    std::abort();
  }
  TROUPE_CUDA_CHECK(status);
  TROUPE_CHECK(reinterpret_cast<uintptr_t>(block) % 64 == 0);
  std::lock_guard<std::mutex> lock(host_mutex_);
  host_block_sizes_[block] = size;
  return block;
}

void cuda_backend::deallocate_host(void* pointer) {
  if (pointer == nullptr) return;
  std::lock_guard<std::mutex> lock(host_mutex_);
  auto found = host_block_sizes_.find(pointer);
  TROUPE_CHECK(found != host_block_sizes_.end());
  free_host_blocks_[found->second].push_back(pointer);
}

float* cuda_backend::allocate_scratch(cudaStream_t s, size_t count) {
  if (count == 0) return nullptr;
  void* pointer = nullptr;
  const cudaError_t status =
      cudaMallocFromPoolAsync(&pointer, count * sizeof(float), scratch_pool_, s);
  if (status == cudaErrorMemoryAllocation) {
    std::fprintf(stderr, "troupe: %s: out of device memory allocating %zu bytes of scratch\n",
                 name().c_str(), count * sizeof(float));
    std::abort();
  }
  TROUPE_CUDA_CHECK(status);
  return static_cast<float*>(pointer);
}

void cuda_backend::free_scratch(cudaStream_t s, float* scratch) {
  if (scratch != nullptr) TROUPE_CUDA_CHECK(cudaFreeAsync(scratch, s));
}

void cuda_backend::copy_host_to_device(stream s, void* device, const void* host, size_t bytes) {
  cudaStream_t cs = enter(s);
  if (bytes == 0) return;
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, cs));
}

void cuda_backend::copy_device_to_host(stream s, void* host, const void* device, size_t bytes) {
  cudaStream_t cs = enter(s);
  if (bytes == 0) return;
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, cs));
}

void cuda_backend::copy_device_to_device(stream s, void* target, const void* source, size_t bytes) {
  cudaStream_t cs = enter(s);
  if (bytes == 0) return;
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(target, source, bytes, cudaMemcpyDeviceToDevice, cs));
}

void cuda_backend::fill(stream s, float* data, float value, size_t count) {
  cuda_kernels::fill(enter(s), data, value, count);
}

// ---- streams and events ---------------------------------------------------------------------

stream cuda_backend::create_stream() {
  activate();
  cudaStream_t s = nullptr;
  TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return stream{s};
}

void cuda_backend::destroy_stream(stream s) {
  cudaStream_t cs = enter(s);
  if (cs == default_stream_) return;  // the default stream lives as long as the backend
  {
    std::lock_guard<std::mutex> lock(blas_mutex_);
    auto found = blas_.find(cs);
    if (found != blas_.end()) {
      TROUPE_CUBLAS_CHECK(cublasDestroy(found->second.handle));
      blas_.erase(found);
    }
  }
  TROUPE_CUDA_CHECK(cudaStreamDestroy(cs));
}

void cuda_backend::synchronize(stream s) { TROUPE_CUDA_CHECK(cudaStreamSynchronize(enter(s))); }

event cuda_backend::create_event() {
  activate();
  cudaEvent_t e = nullptr;
  TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return event{e};
}

void cuda_backend::destroy_event(event e) {
  activate();
  TROUPE_CUDA_CHECK(cudaEventDestroy(to_cuda(e)));
}

void cuda_backend::record_event(event e, stream s) {
  TROUPE_CUDA_CHECK(cudaEventRecord(to_cuda(e), enter(s)));
}

void cuda_backend::wait_event(stream s, event e) {
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(enter(s), to_cuda(e), 0));
}

void cuda_backend::synchronize_event(event e) {
  activate();
  TROUPE_CUDA_CHECK(cudaEventSynchronize(to_cuda(e)));
}

void cuda_backend::set_gemm_precision(stream s, math_precision precision) {
  cudaStream_t cs = enter(s);  // a handle created here binds to this backend's device
  std::lock_guard<std::mutex> lock(blas_mutex_);
  blas_entry(cs).precision = precision;
}

// ---- linear algebra -------------------------------------------------------------------------

void cuda_backend::gemm(stream s, transpose transpose_a, transpose transpose_b, int m, int n, int k,
                        float alpha, const float* a, int lda, const float* b, int ldb, float beta,
                        float* c, int ldc) {
  TROUPE_CHECK(gemm_arguments_valid(transpose_a, transpose_b, m, n, k, lda, ldb, ldc));
  cudaStream_t cs = enter(s);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    cuda_kernels::scale_matrix(cs, c, m, n, ldc, beta);
    return;
  }
  const stream_blas blas = blas_for(cs);
  gemm_runner_->gemm(cs, blas.workspace, blas.precision, transpose_a, transpose_b, m, n, k, alpha,
                     a, lda, b, ldb, beta, c, ldc);
}

void cuda_backend::gemm_batched(stream s, transpose transpose_a, transpose transpose_b, int m,
                                int n, int k, float alpha, const float* a, int lda,
                                int64_t stride_a, const float* b, int ldb, int64_t stride_b,
                                float beta, float* c, int ldc, int64_t stride_c, int batch) {
  TROUPE_CHECK(batch >= 0);
  TROUPE_CHECK(gemm_arguments_valid(transpose_a, transpose_b, m, n, k, lda, ldb, ldc));
  cudaStream_t cs = enter(s);
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {
    for (int i = 0; i < batch; ++i)
      cuda_kernels::scale_matrix(cs, c + i * stride_c, m, n, ldc, beta);
    return;
  }
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a row-major matrix
  // read as column-major is its transpose; so swap the operands and keep each one's op.
  const stream_blas blas = blas_for(cs);
  if (blas.precision == math_precision::fp32) {
    TROUPE_CUBLAS_CHECK(cublasSgemmStridedBatched(
        blas.handle, to_cublas(transpose_b), to_cublas(transpose_a), n, m, k, &alpha, b, ldb,
        stride_b, a, lda, stride_a, &beta, c, ldc, stride_c, batch));
    return;
  }
  const cublasComputeType_t compute = blas.precision == math_precision::tf32
                                          ? CUBLAS_COMPUTE_32F_FAST_TF32
                                          : CUBLAS_COMPUTE_32F_FAST_16BF;
  TROUPE_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      blas.handle, to_cublas(transpose_b), to_cublas(transpose_a), n, m, k, &alpha, b, CUDA_R_32F,
      ldb, stride_b, a, CUDA_R_32F, lda, stride_a, &beta, c, CUDA_R_32F, ldc, stride_c, batch,
      compute, CUBLAS_GEMM_DEFAULT));
}

void cuda_backend::add_row_vector(stream s, float* matrix, const float* vector, int rows,
                                  int cols) {
  TROUPE_CHECK(rows >= 0 && cols >= 0);
  cuda_kernels::add_row_vector(enter(s), matrix, vector, rows, cols);
}

void cuda_backend::sum_rows(stream s, const float* matrix, int rows, int cols, float beta,
                            float* out) {
  TROUPE_CHECK(rows >= 0 && cols >= 0);
  cuda_kernels::sum_rows(enter(s), matrix, rows, cols, beta, out);
}

void cuda_backend::add_channel_vector(stream s, float* data, const float* vector, int batch,
                                      int channels, int spatial) {
  TROUPE_CHECK(batch >= 0 && channels >= 0 && spatial >= 0);
  cuda_kernels::add_channel_vector(enter(s), data, vector, batch, channels, spatial);
}

void cuda_backend::sum_channels(stream s, const float* data, int batch, int channels, int spatial,
                                float beta, float* out) {
  TROUPE_CHECK(batch >= 0 && channels >= 0 && spatial >= 0);
  cuda_kernels::sum_channels(enter(s), data, batch, channels, spatial, beta, out);
}

void cuda_backend::transpose_batched(stream s, const float* in, float* out, int batch, int rows,
                                     int cols) {
  TROUPE_CHECK(batch >= 0 && rows >= 0 && cols >= 0);
  cuda_kernels::transpose_batched(enter(s), in, out, batch, rows, cols);
}

void cuda_backend::axpy(stream s, float alpha, const float* x, float* y, size_t count) {
  cuda_kernels::axpy(enter(s), alpha, x, y, count);
}

void cuda_backend::multiply(stream s, const float* a, const float* b, float* out, size_t count) {
  cuda_kernels::multiply(enter(s), a, b, out, count);
}

void cuda_backend::sum(stream s, const float* x, size_t count, float* out) {
  cudaStream_t cs = enter(s);
  float* scratch = allocate_scratch(cs, cuda_kernels::sum_scratch_count(count));
  cuda_kernels::sum(cs, x, count, out, scratch);
  free_scratch(cs, scratch);
}

// ---- activations and loss -------------------------------------------------------------------

void cuda_backend::activation_forward(stream s, activation f, const float* x, float* y,
                                      size_t count) {
  cuda_kernels::activation_forward(enter(s), f, x, y, count);
}

void cuda_backend::activation_backward(stream s, activation f, const float* x, const float* y,
                                       const float* dy, float* dx, size_t count) {
  cuda_kernels::activation_backward(enter(s), f, x, y, dy, dx, count);
}

void cuda_backend::softmax_cross_entropy(stream s, const float* logits, const int32_t* labels,
                                         int rows, int cols, float gradient_scale, float* gradient,
                                         float* loss_sum, float* correct) {
  TROUPE_CHECK(rows >= 0 && (cols > 0 || rows == 0));
  cudaStream_t cs = enter(s);
  float* scratch = allocate_scratch(cs, cuda_kernels::softmax_cross_entropy_scratch_count(rows));
  cuda_kernels::softmax_cross_entropy(cs, logits, labels, rows, cols, gradient_scale, gradient,
                                      loss_sum, correct, scratch);
  free_scratch(cs, scratch);
}

// ---- convolution and pooling ----------------------------------------------------------------

void cuda_backend::im2col(stream s, const convolution_geometry& g, const float* image,
                          float* columns) {
  check_geometry(g);
  cuda_kernels::im2col(enter(s), g, image, columns);
}

void cuda_backend::col2im(stream s, const convolution_geometry& g, const float* columns,
                          float* image) {
  check_geometry(g);
  cuda_kernels::col2im(enter(s), g, columns, image);
}

void cuda_backend::max_pool_forward(stream s, const pooling_geometry& g, const float* x, float* y,
                                    int32_t* argmax) {
  check_geometry(g);
  cuda_kernels::max_pool_forward(enter(s), g, x, y, argmax);
}

void cuda_backend::max_pool_backward(stream s, const pooling_geometry& g, const float* dy,
                                     const int32_t* argmax, float* dx) {
  check_geometry(g);
  cuda_kernels::max_pool_backward(enter(s), g, dy, argmax, dx);
}

// ---- dropout and optimizers -----------------------------------------------------------------

void cuda_backend::dropout_forward(stream s, const float* x, float* y, float* mask, size_t count,
                                   float probability, uint64_t seed, uint64_t offset) {
  TROUPE_CHECK(probability >= 0.0f && probability <= 1.0f);
  // As on the CPU: with probability 1 nothing is kept, and a zero scale keeps 0 * inf from NaN.
  const float scale = probability < 1.0f ? 1.0f / (1.0f - probability) : 0.0f;
  cuda_kernels::dropout_forward(enter(s), x, y, mask, count, probability, scale, seed, offset);
}

void cuda_backend::sgd_step(stream s, float* weights, const float* gradient, float* velocity,
                            size_t count, const sgd_parameters& p) {
  TROUPE_CHECK(p.momentum == 0.0f || velocity != nullptr);
  cuda_kernels::sgd_step(enter(s), weights, gradient, velocity, count, p);
}

void cuda_backend::adam_step(stream s, float* weights, const float* gradient, float* first_moment,
                             float* second_moment, size_t count, const adam_parameters& p) {
  TROUPE_CHECK(p.step >= 1);
  const double step = static_cast<double>(p.step);
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(p.beta1), step);
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(p.beta2), step);
  const auto step_size = static_cast<float>(p.learning_rate / bias_correction1);
  const auto inverse_sqrt_correction2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  cuda_kernels::adam_step(enter(s), weights, gradient, first_moment, second_moment, count, p,
                          step_size, inverse_sqrt_correction2);
}

}  // namespace

int cuda_runtime_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the error so later runtime calls do not report it
    return 0;
  }
  return count;
}

std::unique_ptr<backend> make_cuda_backend(int device) {
  if (device < 0 || device >= cuda_runtime_device_count()) return nullptr;
  return cuda_backend::open(device);
}

}  // namespace troupe::layers
