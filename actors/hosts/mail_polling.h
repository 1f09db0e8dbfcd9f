#pragma once

// A stage thread's wait for its next message. A thread that sleeps is woken late on a virtual
// machine: its vCPU halts, and the hypervisor must run it again (70-90 µs on the development
// VM after 0.3 ms or more of sleep, against under 1 µs for a thread that polls), and a sync
// pipeline's stage waits once or twice per key. So a stage whose thread has a core of its own
// polls its mailbox for a while before CAF puts it to sleep, as OpenMP runtimes and NCCL's
// proxy threads spin before they block, but only while the machine has a core to spare.

#include <functional>

#include <caf/all.hpp>

#include "actors/engine/run_reports.h"

namespace troupe::actors {

/// Threads the kernel has running or ready to run right now on the whole machine, the caller
/// included (the running count of /proc/loadavg); -1 where it cannot tell.
int runnable_threads();

/// Whether a polling thread takes no core from work: no more threads runnable than cores
/// online (true where the count is unknown).
bool machine_has_spare_core();

/// Why a poll ended.
enum class poll_end { mail, budget, no_spare_core };

/// Returns once `arrived()` holds, `seconds` have passed, or the machine has had no core to
/// spare at two checks in a row (`spare_core`: one at the start, then about every half
/// millisecond). It yields the core on each turn, so a thread made runnable on the same core
/// gets it. seconds ≤ 0 returns at once (with `mail` when `arrived()` holds).
poll_end poll_until(const std::function<bool()>& arrived, double seconds, clock_source& clock,
                    bool (*spare_core)() = machine_has_spare_core);

/// poll_until() the mailbox of `self` holds a message.
poll_end poll_for_mail(caf::scheduled_actor* self, double seconds, clock_source& clock,
                       bool (*spare_core)() = machine_has_spare_core);

}  // namespace troupe::actors
