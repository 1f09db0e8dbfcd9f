// A CUDA build without NCCL: every NCCL entry point fails with a clear error.

#include "layers/cuda/cuda_backend.h"

namespace troupe::layers {

bool cuda_nccl_compiled() { return false; }

std::string cuda_nccl_group_id(std::string* error) {
  *error = "this build of troupe has no NCCL (libnccl was not found at configure time)";
  return "";
}

std::vector<std::unique_ptr<device_group>> cuda_join_nccl_groups(const std::vector<nccl_member>&,
                                                                 double, std::string* error) {
  *error = "this build of troupe has no NCCL (libnccl was not found at configure time)";
  return {};
}

}  // namespace troupe::layers
