// The CUDA backend's memory (cuda_backend_class.cuh): device blocks from the backend's pool,
// kept by size for reuse once freed; scratch on the stream that uses it; pinned host blocks
// kept for reuse; and the copies between them.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "layers/check.h"
#include "layers/cuda/cuda_backend_class.cuh"

namespace troupe::layers {

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

}  // namespace troupe::layers
