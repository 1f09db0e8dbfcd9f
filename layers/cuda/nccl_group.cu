// NCCL groups: the same stage of the replicas, one rank per GPU, summing in place on the GPUs.
// Communicators are non-blocking, so that one thread may start the ranks of several groups at
// once (a worker hosting several stages) and give up with a clear error when a peer never
// comes; every call is then finished by polling ncclCommGetAsyncError.

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "layers/cuda/cuda_backend.h"
#include "layers/device_group.h"

namespace troupe::layers {
namespace {

using clock_type = std::chrono::steady_clock;

std::string describe(ncclResult_t result) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) text += std::string(": ") + last;
  return text;
}

/// Waits for `comm`'s last call; its result (ncclSuccess when it finished), or ncclInProgress
/// when `deadline` passed first.
ncclResult_t settle(ncclComm_t comm, clock_type::time_point deadline) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
    if (asked != ncclSuccess) return asked;
    if (state != ncclInProgress) return state;
    if (clock_type::now() > deadline) return ncclInProgress;
    std::this_thread::yield();
  }
}

int device_index(const backend& device) {
  const std::string name = device.name();
  return std::atoi(name.substr(name.find(':') + 1).c_str());
}

class nccl_rank final : public device_group {
 public:
  nccl_rank(ncclComm_t comm, int device, int rank, int ranks)
      : comm_(comm), device_(device), rank_(rank), ranks_(ranks) {}
  // Abort, not destroy: destroying waits for the group's queued work, which never ends when a
  // peer was lost (the recovery that follows builds fresh groups).
  ~nccl_rank() override { ncclCommAbort(comm_); }

  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }
  std::string kind() const override { return "nccl"; }

  void all_reduce_sum(stream s, const std::vector<device_span>& buffers) override {
    cudaSetDevice(device_);
    const cudaStream_t on = static_cast<cudaStream_t>(s.handle);
    ncclResult_t result = ncclGroupStart();
    for (const device_span& buffer : buffers) {
      if (result != ncclSuccess && result != ncclInProgress) break;
      result =
          ncclAllReduce(buffer.data, buffer.data, buffer.count, ncclFloat32, ncclSum, comm_, on);
    }
    const ncclResult_t ended = ncclGroupEnd();
    if (result == ncclSuccess || result == ncclInProgress) result = ended;
    // A non-blocking communicator may still be queuing the calls; no deadline: the peers are in
    // the same step, and the stream waits for them as it would for any kernel.
    if (result == ncclInProgress) result = settle(comm_, clock_type::time_point::max());
    if (result != ncclSuccess) {
      std::fprintf(stderr, "troupe: NCCL all-reduce of rank %d of %d failed: %s\n", rank_, ranks_,
                   describe(result).c_str());
      std::abort();
    }
  }

 private:
  ncclComm_t comm_;
  int device_;
  int rank_;
  int ranks_;
};

bool id_from_hex(const std::string& hex, ncclUniqueId* id) {
  if (hex.size() != 2 * sizeof(id->internal)) return false;
  for (size_t i = 0; i < sizeof(id->internal); ++i) {
    unsigned value = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &value) != 1) return false;
    id->internal[i] = static_cast<char>(value);
  }
  return true;
}

}  // namespace

bool cuda_nccl_compiled() { return true; }

std::string cuda_nccl_group_id(std::string* error) {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) {
    *error = "NCCL could not make a group id: " + describe(result);
    return "";
  }
  std::string hex;
  char digits[3];
  for (char byte : id.internal) {
    std::snprintf(digits, sizeof digits, "%02x", static_cast<unsigned char>(byte));
    hex += digits;
  }
  return hex;
}

std::vector<std::unique_ptr<device_group>> cuda_join_nccl_groups(
    const std::vector<nccl_member>& members, double timeout_s, std::string* error) {
  std::vector<ncclComm_t> comms(members.size(), nullptr);
  const auto fail = [&](const std::string& why) {
    for (ncclComm_t comm : comms) {
      if (comm) ncclCommAbort(comm);
    }
    *error = why;
    return std::vector<std::unique_ptr<device_group>>{};
  };
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclGroupStart();
  for (size_t i = 0; i < members.size(); ++i) {
    const nccl_member& member = members[i];
    ncclUniqueId id;
    if (!id_from_hex(member.group_id, &id)) {
      ncclGroupEnd();
      return fail("NCCL group id '" + member.group_id.substr(0, 16) + "…' is not " +
                  std::to_string(2 * sizeof(id.internal)) + " hex digits");
    }
    cudaSetDevice(device_index(*member.device));
    const ncclResult_t result =
        ncclCommInitRankConfig(&comms[i], member.ranks, id, member.rank, &config);
    if (result != ncclSuccess && result != ncclInProgress) {
      ncclGroupEnd();
      return fail("rank " + std::to_string(member.rank) + " of " + std::to_string(member.ranks) +
                  " could not start joining its NCCL group: " + describe(result));
    }
  }
  const ncclResult_t ended = ncclGroupEnd();
  if (ended != ncclSuccess && ended != ncclInProgress) {
    return fail("NCCL could not start its groups: " + describe(ended));
  }
  const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                std::chrono::duration<double>(timeout_s));
  for (size_t i = 0; i < members.size(); ++i) {
    const ncclResult_t result = settle(comms[i], deadline);
    if (result == ncclInProgress) {
      return fail("rank " + std::to_string(members[i].rank) + " of " +
                  std::to_string(members[i].ranks) + " waited " + std::to_string(timeout_s) +
                  " s for the other ranks of its NCCL group");
    }
    if (result != ncclSuccess) {
      return fail("rank " + std::to_string(members[i].rank) + " of " +
                  std::to_string(members[i].ranks) +
                  " could not join its NCCL group: " + describe(result));
    }
  }
  std::vector<std::unique_ptr<device_group>> groups;
  for (size_t i = 0; i < members.size(); ++i) {
    groups.push_back(std::make_unique<nccl_rank>(comms[i], device_index(*members[i].device),
                                                 members[i].rank, members[i].ranks));
  }
  return groups;
}

}  // namespace troupe::layers
