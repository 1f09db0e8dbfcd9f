#pragma once

// Signals during `troupe train` and `troupe coordinator`: SIGUSR1 asks for a checkpoint and
// training goes on; SIGTERM (what Slurm sends before preemption) asks for a checkpoint and
// then a clean stop; a second SIGTERM, or SIGINT (Ctrl-C), ends the process at once, taking
// the local worker processes with it.

#include <atomic>

namespace troupe::apps {

/// Installs the handlers; returns the request flag the engine polls (1: checkpoint,
/// 2: checkpoint and stop).
std::atomic<int>* install_run_signals();

}  // namespace troupe::apps
