#include "layers/backend_registry.h"

#include <cstdlib>

#include "layers/cpu/cpu_backend.h"
#ifdef TROUPE_WITH_CUDA
#include "layers/cuda/cuda_backend.h"
#endif

namespace troupe::layers {

bool cuda_compiled() {
#ifdef TROUPE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef TROUPE_WITH_CUDA
  return cuda_runtime_device_count();
#else
  return 0;
#endif
}

namespace {

std::unique_ptr<backend> create_cuda(int index, std::string* error) {
#ifdef TROUPE_WITH_CUDA
  int count = cuda_runtime_device_count();
  if (count == 0) {
    *error = "device cuda:" + std::to_string(index) + " is not present: no CUDA device found";
    return nullptr;
  }
  if (index < 0 || index >= count) {
    *error = "device cuda:" + std::to_string(index) + " is not present (" + std::to_string(count) +
             " CUDA device(s) found)";
    return nullptr;
  }
  auto result = make_cuda_backend(index);
  if (!result) *error = "device cuda:" + std::to_string(index) + " could not be opened";
  return result;
#else
  (void)index;
  *error = "this build of troupe has no CUDA backend (configure with nvcc available)";
  return nullptr;
#endif
}

}  // namespace

std::unique_ptr<backend> create_backend(const std::string& device, int cpu_threads,
                                        std::string* error) {
  if (device == "cpu") return make_cpu_backend(cpu_threads);
  if (device == "cuda") return create_cuda(0, error);
  if (device.rfind("cuda:", 0) == 0) {
    const std::string number = device.substr(5);
    char* end = nullptr;
    long index = std::strtol(number.c_str(), &end, 10);
    if (!number.empty() && *end == '\0') return create_cuda(static_cast<int>(index), error);
  }
  *error = "unknown device '" + device + "' (expected \"cpu\", \"cuda\" or \"cuda:N\")";
  return nullptr;
}

bool nccl_compiled() {
#ifdef TROUPE_WITH_CUDA
  return cuda_nccl_compiled();
#else
  return false;
#endif
}

std::string make_nccl_group_id(std::string* error) {
#ifdef TROUPE_WITH_CUDA
  if (cuda_nccl_compiled()) return cuda_nccl_group_id(error);
#endif
  *error = "this build of troupe has no NCCL (it needs CUDA and NCCL at configure time)";
  return "";
}

std::vector<std::unique_ptr<device_group>> join_nccl_groups(const std::vector<nccl_member>& members,
                                                            double timeout_s, std::string* error) {
  for (const nccl_member& member : members) {
    if (!member.device || member.device->kind() != device_kind::cuda) {
      *error = "NCCL groups need CUDA devices; rank " + std::to_string(member.rank) + " is on " +
               (member.device ? member.device->name() : std::string("no device"));
      return {};
    }
  }
#ifdef TROUPE_WITH_CUDA
  if (cuda_nccl_compiled()) return cuda_join_nccl_groups(members, timeout_s, error);
#endif
  (void)timeout_s;
  *error = "this build of troupe has no NCCL (it needs CUDA and NCCL at configure time)";
  return {};
}

std::optional<library_gemm_timing> best_library_gemm(backend& device, stream s,
                                                     math_precision precision,
                                                     transpose transpose_a, transpose transpose_b,
                                                     int m, int n, int k, const float* a, int lda,
                                                     const float* b, int ldb, float* c, int ldc,
                                                     int repeats) {
  if (device.kind() != device_kind::cuda) return std::nullopt;
#ifdef TROUPE_WITH_CUDA
  const int index = std::atoi(device.name().substr(device.name().find(':') + 1).c_str());
  return cuda_best_library_gemm(index, s.handle ? s : device.default_stream(), precision,
                                transpose_a, transpose_b, m, n, k, a, lda, b, ldb, c, ldc, repeats);
#else
  (void)s, (void)precision, (void)transpose_a, (void)transpose_b, (void)m, (void)n, (void)k;
  (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc, (void)repeats;
  return std::nullopt;
#endif
}

}  // namespace troupe::layers
