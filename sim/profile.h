#pragma once

// Measured costs of one job's blocks on this machine's backend (`troupe calibrate`, see
// sim/calibration/calibrate.h), which
// the simulator charges instead of the roofline model's estimates (`troupe simulate
// --profile`). Times are seconds for a key of `batch` samples and scale linearly with the
// batch; the optimizer step does not depend on it.

#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_config.h"
#include "sim/cluster_model.h"

namespace troupe::sim {

struct block_profile {
  std::string type;
  double forward_s = 0;
  double backward_s = 0;  ///< weight and input gradients
  /// Without the input gradient, as the first stage runs the blocks up to the model's first
  /// with parameters (and, split off, the weight gradients of a zero-bubble schedule's W).
  double backward_first_s = 0;
  double step_s = 0;
  double stash_s = 0;  ///< a copy of the weights kept for asynchronous keys (0 in sync mode)
  /// A copy of the weights moved back along the momentum, as staleness_correction = "predict"
  /// takes one for each version (0: not measured, the simulator charges two stashes).
  double predict_s = 0;
  /// Forward in evaluation mode for machine_profile::evaluation_batch samples (0: unknown):
  /// GEMMs of a bigger batch run faster per sample, so this is not forward_s scaled.
  double evaluate_s = 0;
};

/// Measured costs of one node of a model graph (model.nodes): one visit of the node at each of a
/// few row counts, as a stage runs it (a chain node's one visit over the key's rows; a loop or
/// tree node's visit of a group of ready parts, with its rows gathered and scattered around its
/// blocks), which the simulator interpolates between. The times at a visit's rows include the
/// visit's own overhead (the gathers, the blocks' launches): what the line through two of them
/// gives at 0 rows.
struct node_profile {
  std::string name;
  std::vector<int64_t> rows;  ///< the visits' row counts, increasing
  /// One visit, per entry of `rows`: forward in training, backward with the input gradient and
  /// without it (the graph's first node, whose input is token ids); per entry of
  /// `evaluation_rows`, forward in evaluation.
  std::vector<double> forward_s, backward_s, backward_first_s;
  /// The row counts of evaluate_s, whose keys (the held-out set's, evaluation_batch instances
  /// each) bring bigger visits than training keys; empty: `rows`.
  std::vector<int64_t> evaluation_rows;
  std::vector<double> evaluate_s;
  double step_s = 0;
  double stash_s = 0;
  double predict_s = 0;  ///< 0: not measured (two stashes are charged)
};

struct machine_profile {
  std::string backend;           ///< e.g. "cpu"
  int threads = 1;               ///< per stage
  int64_t batch = 1;             ///< samples per key the blocks were timed with
  int64_t evaluation_batch = 0;  ///< samples per key of block_profile::evaluate_s (0: none)
  std::vector<block_profile> blocks;
  /// A model graph's nodes, in the order rows visit them (then `blocks` is empty and `batch`
  /// counts instances).
  std::vector<node_profile> nodes;
  double loss_s = 0;  ///< the loss over the last block's output, for `batch` samples
  /// Rows of loss_s for a model graph (0: `batch`): a key's rows at the loss are its parts or
  /// its instances, whichever its last node gives.
  int64_t loss_rows = 0;
  /// One message between processes on this machine (ipc://): latency and bandwidth.
  double link_latency_s = 0;
  double link_bandwidth = 0;
  /// CPU seconds one end of a key's input message costs a stage (sending or receiving it):
  /// between threads of one process (inproc://) and between processes (ipc://).
  /// With the per-byte figures below these are the fixed part (a message of no payload); a
  /// profile without them charges every message the figure of a key of the calibrated input.
  double inproc_message_cpu_s = 0;
  double ipc_message_cpu_s = 0;
  /// CPU seconds per byte of a message's payload on top of the fixed part (copies, encoding):
  /// a stage's messages are as big as its activations, which can be many times the input.
  double inproc_message_cpu_per_byte_s = 0;
  double ipc_message_cpu_per_byte_s = 0;
  /// From a key's send to its receiving thread holding it decoded, between threads of one
  /// process (inproc://, a receiver thread and the handler's thread woken in turn); 0: unknown.
  double inproc_latency_s = 0;
  /// The share of the cores that the job's stages' work gets as processes of their own, more
  /// of them than cores, while it keeps every core busy (1: fair sharing; see
  /// pool_state::sliced_rate): the share at which the simulator trains the job as
  /// fast as a stand-in pipeline of the job's stage times ran, measured only when the stages
  /// outnumber the cores (see process_pipeline.h and fit_time_slice_efficiency()).
  double time_slice_efficiency = 1;
  /// Seconds per float of copying a stage's gradients or weights to host memory or back, as
  /// the replicas' all-reduce does around each round (0: unknown; the device's memory
  /// bandwidth is charged instead).
  double parameter_copy_s_per_float = 0;
  /// CPU seconds the coordinator spends per sample of a key it admits: the sample's features
  /// gathered from the training set into the key's payload, and the key encoded (0: unknown).
  double coordinator_s_per_sample = 0;
  /// The spread of the stages' pass times as calibration measured them (log_spread(): the
  /// standard deviation of a time's logarithm, in [0, 1]); devices of a cluster that gives them
  /// none get it as device_model::work_jitter. 0: unknown (a profile from before the field).
  double work_jitter = 0;
};

/// Gives every device port of `cluster` the profile's measured message latency (half on each
/// side) and bandwidth: between processes (ipc://), or with `in_process` between the stages of
/// one process (inproc://, when the profile has that figure). Between processes, time-sliced
/// device types also get the profile's time_slice_efficiency. Devices without a work_jitter
/// of their own get the profile's.
void use_measured_transport(const machine_profile& profile, cluster_model* cluster,
                            bool in_process = false);

std::string to_json_text(const machine_profile& profile);
/// Nothing, with `error` naming `source` and the bad field, when the text is not a profile.
std::optional<machine_profile> parse_profile(const std::string& text, const std::string& source,
                                             std::string* error);
std::optional<machine_profile> load_profile(const std::string& path, std::string* error);

}  // namespace troupe::sim
