#pragma once

// A group of ranks that sum buffers in place on their own devices: the same stage of R replicas
// summing its gradients (or its weights, to average them) without a trip through host memory
// and messages. Every rank calls each collective in the same order, with the same count. NCCL
// groups (CUDA devices, in any processes) come from backend_registry.h; a shared-memory group
// joins ranks that are threads of one process.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "layers/backend.h"

namespace troupe::layers {

/// `count` floats at `data`, memory of the backend a rank joined with.
struct device_span {
  float* data = nullptr;
  size_t count = 0;
};

class device_group {
 public:
  virtual ~device_group() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  /// "nccl" or "shared memory".
  virtual std::string kind() const = 0;
  /// Queues on `s` the sum over the ranks of each of `buffers` into itself, as one collective
  /// (NCCL fuses them into one launch). Every rank passes the same counts in the same order and
  /// ends with the same bits.
  virtual void all_reduce_sum(stream s, const std::vector<device_span>& buffers) = 0;
};

/// `ranks` ranks that are threads of one process, on CPU backends; rank r is element r. Each
/// all_reduce_sum blocks its caller until every rank has called it (so each rank needs a thread
/// of its own) and adds the ranks' buffers in rank order. A rank whose counts differ from the
/// others' aborts the process: the group's contract is broken, and no buffer is safe to read.
std::vector<std::unique_ptr<device_group>> make_shared_memory_group(int ranks);

/// One rank of an NCCL group to join (backend_registry.h's join_nccl_groups).
struct nccl_member {
  backend* device = nullptr;  ///< a CUDA backend, which the rank's collectives run on
  std::string group_id;       ///< make_nccl_group_id()'s, the same for every rank of the group
  int rank = 0;
  int ranks = 1;
};

}  // namespace troupe::layers
