// The CUDA + cuBLAS backend (cuda_backend_class.cuh): opening a device, streams and events,
// GEMMs and the kernels' launches. Device and pinned host memory are in cuda_memory.cu.

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
#include "layers/cuda/cuda_backend_class.cuh"
#include "layers/cuda/cuda_gemm.cuh"
#include "layers/cuda/cuda_kernels.cuh"

namespace troupe::layers {
namespace {

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

}  // namespace

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
  device_blocks_.drain([&](void* block) { cudaFreeAsync(block, allocation_stream_); });
  for (const auto& entry : blas_) {
    cublasDestroy(entry.second.handle);
    if (entry.second.workspace != nullptr) cudaFree(entry.second.workspace);
  }
  // Blocks still out (a contract violation) are left alone: someone may still read them.
  host_blocks_.drain([](void* block) { cudaFreeHost(block); });
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

void cuda_backend::copy_matrix(stream s, const float* source, int source_stride, float* target,
                               int target_stride, int rows, int cols) {
  TROUPE_CHECK(rows >= 0 && cols >= 0 && source_stride >= cols && target_stride >= cols);
  if (rows == 0 || cols == 0) return;
  TROUPE_CUDA_CHECK(cudaMemcpy2DAsync(target, sizeof(float) * target_stride, source,
                                      sizeof(float) * source_stride, sizeof(float) * cols, rows,
                                      cudaMemcpyDeviceToDevice, enter(s)));
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
  cuda_kernels::adam_step(enter(s), weights, gradient, first_moment, second_moment, count, p);
}

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
