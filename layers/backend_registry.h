#pragma once

// The one place that knows which backends were compiled in.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "layers/backend.h"
#include "layers/device_group.h"

namespace troupe::layers {

/// Whether this build contains the CUDA backend.
bool cuda_compiled();

/// Number of usable CUDA devices (0 when CUDA is not compiled in or no GPU/driver is present).
int cuda_device_count();

/// Creates the backend named by `device`: "cpu", "cuda" (device 0) or "cuda:N". `cpu_threads`
/// is the number of BLAS threads the CPU backend may use (0: every core). Returns null and
/// fills `error` when the device is unknown, not compiled in, or absent.
std::unique_ptr<backend> create_backend(const std::string& device, int cpu_threads,
                                        std::string* error);

/// Whether this build can join NCCL groups (CUDA with NCCL).
bool nccl_compiled();

/// A fresh NCCL group id (hex digits) for make_nccl_groups' members; this process roots the
/// group's bootstrap, so it must outlive the joining. "" with `error` set without NCCL.
std::string make_nccl_group_id(std::string* error);

/// Joins every member's rank of its NCCL group at once, waiting up to `timeout_s` seconds for
/// the groups' other ranks, which may be in other processes. One group per member, in order, or
/// none with `error` set (NCCL's own words: a GPU that two ranks share, a peer that never came).
std::vector<std::unique_ptr<device_group>> join_nccl_groups(const std::vector<nccl_member>& members,
                                                            double timeout_s, std::string* error);

/// The device library's best for one GEMM shape (cuBLAS on CUDA).
struct library_gemm_timing {
  double seconds = 0;  ///< the fastest algorithm's seconds per call (0: none ran)
  int algorithms = 0;  ///< how many algorithms were timed
};

/// On a CUDA backend: the fastest of the algorithms cuBLASLt proposes for C = op(A) op(B) as
/// backend::gemm poses it at `precision` (alpha 1, beta 0), each timed over `repeats` calls on
/// `s`; A, B and C are `device`'s memory and C is overwritten. nullopt on any other backend.
/// Blocks until done. For benchmarks, which hold the backend's own GEMM against it.
std::optional<library_gemm_timing> best_library_gemm(backend& device, stream s,
                                                     math_precision precision,
                                                     transpose transpose_a, transpose transpose_b,
                                                     int m, int n, int k, const float* a, int lda,
                                                     const float* b, int ldb, float* c, int ldc,
                                                     int repeats);

}  // namespace troupe::layers
