#pragma once

// A stand-in for a pipeline whose stages are processes of their own on this machine: each
// stage process spins on its core for the stage's measured time per key and passes the key on
// over ipc:// as the engine's own key frames, which it decodes as a stage does (so each message
// costs what calibration measured for one), and a coordinator process admits the keys and hears
// the stages' reports. `troupe calibrate` runs it to measure how much of
// the cores such processes get when they outnumber them: the operating system's switches,
// wake-ups and uneven spreading over the cores cost what a model of fair sharing does not see.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::sim {

struct pipeline_stage_cost {
  /// CPU seconds per key: its forward visit (the last stage: forward and backward in one) and
  /// its backward visit with its share of the step (0 for the last stage).
  double forward_s = 0;
  double backward_s = 0;
  size_t output_bytes = 0;  ///< of the key's activation it sends forward
};

/// Runs one process per stage of `stages` (at least one) and a coordinator's with `keys` keys in
/// flight: a key of `input_bytes` goes forward through every stage and back, and the
/// coordinator admits a new one when the first stage reports it done (with `flush`: the next
/// `keys` when all of them are done, as sync mode drains a step's micro-batches). The keys are
/// the engine's key messages of `samples` samples, framed and decoded as stages do, so that
/// each message costs what the calibrated ipc:// message cost says it does. A stage process
/// waits for its next message as a stage's thread does: it polls for up to `spin_wait_s`
/// (actors::poll_until(), giving way when the machine has no core to spare), then sleeps.
/// Returns the keys per second finished over at least `seconds` after a warm-up; nothing, with
/// `error` set, when the processes could not start or stopped passing keys.
std::optional<double> process_pipeline_keys_per_s(const std::vector<pipeline_stage_cost>& stages,
                                                  size_t input_bytes, int64_t samples, int keys,
                                                  bool flush, double spin_wait_s, double seconds,
                                                  std::string* error);

}  // namespace troupe::sim
