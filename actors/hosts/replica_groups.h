#pragma once

// The replica groups of `parallelism.collective` "nccl" and "shared_memory": the same stage of
// every replica summing on its devices instead of over the ring. A process joins its own stage
// actors to their groups once they are built and before they run.

#include <memory>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "actors/hosts/actor_hosting.h"

namespace troupe::actors {

/// How long a process waits for the ranks of its NCCL groups in other processes.
constexpr double replica_group_join_timeout_s = 120;

/// Whether `config`'s stages sum through replica groups rather than the ring.
bool uses_replica_groups(const job_config& config);

/// Why `config` cannot run its replica groups with every stage actor in this one process
/// (`one_process`) or spread over worker processes; "" when it can. One line for the user: the
/// build has no NCCL, two replicas of a stage share a GPU in one process, shared memory across
/// processes.
std::string replica_group_problem(const job_config& config, bool one_process);

/// One NCCL group id per stage (the coordinator's, sent in each assignment), or none with
/// `error` set; empty when `config` has no NCCL groups.
std::vector<std::string> make_replica_group_ids(const job_config& config, std::string* error);

/// Joins the stage actors of `parts` (this process's) to their groups and hands each its rank:
/// shared memory among the parts themselves, NCCL with `group_ids` (one per stage), waiting up
/// to `timeout_s` for the ranks in other processes. Nothing to do without replica groups.
/// False, with `error` naming the stage, when a group cannot form.
bool join_replica_groups(const job_config& config,
                         const std::vector<std::shared_ptr<stage_parts>>& parts,
                         const std::vector<std::string>& group_ids, double timeout_s,
                         std::string* error);

}  // namespace troupe::actors
