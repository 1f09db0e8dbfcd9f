#pragma once

// How much memory this machine can give a run, for the checks made before anything is
// allocated (actors::check_memory).

namespace troupe::apps {

/// Bytes of memory available now: MemAvailable of /proc/meminfo (free memory and the caches
/// the kernel would drop), or the physical memory where that cannot be read.
double available_memory_bytes();

}  // namespace troupe::apps
