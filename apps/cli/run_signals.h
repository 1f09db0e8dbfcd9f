#pragma once

// Signals during `troupe train` and `troupe coordinator`: SIGUSR1 asks for a checkpoint and
// training goes on; SIGUSR2 asks for a status report of every stage (docs/guide/dashboard.md);
// SIGTERM (what Slurm sends before preemption) asks for a checkpoint and then a clean stop; a
// second SIGTERM, or SIGINT (Ctrl-C), ends the process at once, taking the local worker processes
// with it.
// `troupe worker` passes a SIGTERM on to its coordinator.

#include <atomic>
#include <initializer_list>

namespace troupe::apps {

/// Installs the handlers; returns the request flag the engine polls (1: checkpoint,
/// 2: checkpoint and stop).
std::atomic<int>* install_run_signals();

/// Set by SIGUSR2 (after install_run_signals()): a status report is asked for.
std::atomic<bool>* status_requests();

/// Makes `handler` (async-signal-safe) handle each of `signals`.
void handle_signals(void (*handler)(int), std::initializer_list<int> signals);

/// `troupe worker`'s handler: the first SIGTERM sets the returned flag, which the worker passes
/// on to its coordinator as a request to checkpoint and stop the run (a launcher's SIGTERM
/// reaches every task, and a worker that died of it would be recovered instead); the worker
/// serves on until the coordinator finishes the job. A second SIGTERM ends it at once.
std::atomic<bool>* install_worker_signals();

}  // namespace troupe::apps
