// The CUDA backend's memory (cuda_backend_class.cuh): device blocks from the backend's pool,
// kept by size for reuse once freed; scratch on the stream that uses it; pinned host blocks
// kept for reuse; and the copies between them.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "layers/check.h"
#include "layers/cuda/cuda_backend_class.cuh"
#include "layers/out_of_memory.h"

namespace troupe::layers {

void* allocate_on_stream(int device, cudaMemPool_t pool, cudaStream_t s, size_t bytes,
                         const char* purpose) {
  if (bytes == 0) return nullptr;
  void* pointer = nullptr;
  const cudaError_t status = cudaMallocFromPoolAsync(&pointer, bytes, pool, s);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw out_of_memory("cuda:" + std::to_string(device) + " device memory (" + purpose + ")",
                        bytes);
  }
  TROUPE_CUDA_CHECK(status);
  return pointer;
}

void* cuda_backend::allocate(size_t bytes) {
  const size_t size = std::max<size_t>(bytes, 1);
  // A block of this size freed before is reused without a call into the driver: a training
  // step allocates the same shapes every time.
  if (void* block = device_blocks_.take(size)) return block;
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
    cudaGetLastError();
    throw out_of_memory(name() + " device memory", bytes);
  }
  TROUPE_CUDA_CHECK(status);
  // The allocation has completed once this returns, so any stream may use the memory.
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(allocation_stream_));
  TROUPE_CHECK(reinterpret_cast<uintptr_t>(pointer) % 64 == 0);
  device_blocks_.add(pointer, size);
  return pointer;
}

void cuda_backend::deallocate(void* pointer) {
  // Callers free a block once no work uses it, so it may be handed out again at once.
  if (pointer != nullptr) TROUPE_CHECK(device_blocks_.give_back(pointer));
}

void cuda_backend::release_free_blocks() {
  activate();
  device_blocks_.drain(
      [&](void* block) { TROUPE_CUDA_CHECK(cudaFreeAsync(block, allocation_stream_)); });
  TROUPE_CUDA_CHECK(cudaStreamSynchronize(allocation_stream_));
}

void* cuda_backend::allocate_host(size_t bytes) {
  size_t size = 4096;
  while (size < bytes) size *= 2;
  if (void* block = host_blocks_.take(size)) return block;
  activate();
  void* block = nullptr;
  // Portable: pinned for every device's context, whichever backend copies through it.
  const cudaError_t status = cudaHostAlloc(&block, size, cudaHostAllocPortable);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw out_of_memory(name() + " pinned host memory", size);
  }
  TROUPE_CUDA_CHECK(status);
  TROUPE_CHECK(reinterpret_cast<uintptr_t>(block) % 64 == 0);
  host_blocks_.add(block, size);
  return block;
}

void cuda_backend::deallocate_host(void* pointer) {
  if (pointer != nullptr) TROUPE_CHECK(host_blocks_.give_back(pointer));
}

float* cuda_backend::allocate_scratch(cudaStream_t s, size_t count) {
  return static_cast<float*>(
      allocate_on_stream(device_, scratch_pool_, s, count * sizeof(float), "scratch"));
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

}  // namespace troupe::layers
