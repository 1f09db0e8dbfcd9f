#pragma once

// Who this process is when an existing launcher (Slurm, mpirun, torchrun, a hostfile) started
// one copy per rank: rank 0 becomes the coordinator, the others workers. Only reads the
// environment and hostfiles; opens no sockets.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "apps/cli/host_lists.h"

namespace troupe::apps {

/// What the launcher told this process. Invariants: 1 <= world_size, 0 <= rank < world_size,
/// 0 <= local_rank < world_size, and `hosts` is empty or holds exactly world_size entries.
struct launch_environment {
  /// "torchrun", "slurm", "openmpi", "mpich", "pmix", "hostfile" or "none".
  std::string launcher = "none";
  int rank = 0;
  int world_size = 1;
  /// Rank among the ranks on this host; taken from the launcher, else counted in `hosts`.
  int local_rank = 0;
  /// Where rank 0 runs (the rendezvous host), a name or an address (IPv6 without brackets);
  /// empty when nothing says, and the caller must then ask for TROUPE_COORDINATOR or
  /// TROUPE_HOSTFILE.
  std::string coordinator_host;
  /// 0 when no variable names one; the caller then picks its default. Under torchrun this is
  /// MASTER_PORT, which torch elastic's own store normally holds on rank 0's host, so a caller
  /// that binds there should offset it or ask for TROUPE_COORDINATOR_PORT.
  int coordinator_port = 0;
  /// hosts[r] is where rank r runs, when the launcher says (Slurm block or cyclic
  /// distribution, a hostfile in slot order); else empty.
  host_names hosts;
};

/// Returns the value of the environment variable `name`, or nothing when it is unset.
using variable_lookup = std::function<std::optional<std::string>(const std::string& name)>;

/// Returns the contents of the file at `path`, or nothing with `error` saying why.
using file_reader =
    std::function<std::optional<std::string>(const std::string& path, std::string* error)>;

/// Works out the launcher and this process's place in the job from the variables `get`
/// returns, reading TROUPE_HOSTFILE through `read` when it is set.
///
/// Launchers, most specific first:
///  - torchrun: RANK and WORLD_SIZE (LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
///  - Open MPI: OMPI_COMM_WORLD_RANK and _SIZE (_LOCAL_RANK); MPICH/Hydra: PMI_RANK and
///    PMI_SIZE (MPI_LOCALRANKID); PMIx: PMIX_RANK and OMPI_COMM_WORLD_SIZE.
///  - Slurm: SLURM_PROCID and SLURM_NTASKS (or SLURM_NPROCS), SLURM_LOCALID, the nodelist
///    (SLURM_STEP_NODELIST, SLURM_NODELIST or SLURM_JOB_NODELIST), the tasks per node
///    (SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE, e.g. "2(x3),1") and
///    SLURM_DISTRIBUTION. The coordinator is the first node of the nodelist (none under an
///    arbitrary distribution); hosts are known for block (the default) and cyclic ones.
///  - hostfile: TROUPE_HOSTFILE (see read_hostfile) and TROUPE_RANK; world size = slots.
///  - none of these: launcher "none", rank 0 of 1, and no other variable is read.
/// An MPI launcher wins over Slurm unless both report the same rank and size (srun with an
/// MPI plugin); mpirun inside an allocation leaves its daemons' SLURM_PROCID behind.
///
/// Coordinator host: TROUPE_COORDINATOR (host[:port]), else the launcher's (MASTER_ADDR for
/// torchrun and the MPI launchers, the first node for Slurm), else hosts[0]. Port:
/// TROUPE_COORDINATOR's, else TROUPE_COORDINATOR_PORT, else MASTER_PORT, else 0. When the
/// launcher gives no hosts and TROUPE_HOSTFILE is set, the file supplies them (rank r on
/// slot r, mpirun's default mapping) and must have world_size slots.
///
/// On bad input returns nothing and sets `error` (when not null) to one line naming the
/// variable and its value. Thread-safe when `get` and `read` are.
std::optional<launch_environment> detect_launch_environment(const variable_lookup& get,
                                                            const file_reader& read,
                                                            std::string* error);

/// As above, reading TROUPE_HOSTFILE from disk.
std::optional<launch_environment> detect_launch_environment(const variable_lookup& get,
                                                            std::string* error);

/// As above, from this process's environment (getenv) and files.
std::optional<launch_environment> detect_launch_environment(std::string* error);

/// The whole text of the file at `path`; nothing, with `error` saying why, when it cannot be
/// read (a directory, missing, unreadable).
std::optional<std::string> read_text_file(const std::string& path, std::string* error);

}  // namespace troupe::apps
