#pragma once

// The cluster a simulation runs on, read from a TOML file (`troupe simulate --cluster FILE`):
// nodes holding devices, and the links between them. A message from one device to another
// crosses a path of links; the network model shares each link's bandwidth among the flows
// crossing it.
//
// Topology: every device has an egress and an ingress port (NVLink or PCIe inside its node);
// every node has a NIC (egress and ingress); nodes hang off leaf switches, `nodes_per_switch`
// each, whose uplinks to the spine carry `nodes_per_switch` NICs' bandwidth divided by
// `oversubscription`. Paths:
//   same device            -> no links
//   same node              -> device egress, device ingress
//   same switch            -> device egress, NIC egress, NIC ingress, device ingress
//   different switches     -> device egress, NIC egress, switch uplink, switch downlink,
//                             NIC ingress, device ingress
// The coordinator lives on the host of node 0 (device index `host_device`): its messages
// start or end at node 0 without a device port (NIC links only when the other end is on
// another node). An optional [storage] table says how fast checkpoints are written and read.

#include <optional>
#include <string>
#include <vector>

namespace troupe::sim {

struct device_model {
  std::string name;              ///< "<node name>/<kind><index>", e.g. "node3/gpu1"
  std::string type;              ///< the [device_types.X] it was made from
  int node = 0;                  ///< index into cluster_model::nodes
  double peak_flops = 0;         ///< FLOP/s of dense float math
  double memory_bandwidth = 0;   ///< bytes/s
  double memory_bytes = 0;       ///< capacity
  double launch_overhead_s = 0;  ///< per kernel launch
  double efficiency = 1;         ///< fraction of peak that layer kernels reach (0, 1]
  /// The node's devices of this type form one pool (`pooled = true`): a stage placed on any of
  /// them runs on whichever is free, as threads that the operating system schedules on a
  /// node's cores do. Otherwise a stage runs on its own device only.
  bool pooled = false;
  /// With `pooled`: every stage with work runs at once and the operating system time-slices
  /// them over the pool's devices (`time_sliced = true`: stages in processes of their own, each
  /// its own thread); otherwise a stage waits for a free device and runs to the end of its work
  /// (the stages of one process on a scheduler with a thread per device).
  bool time_sliced = false;
  /// With `time_sliced`, where more stage processes than devices share the pool: the share of
  /// the pool's devices that the stages' work gets while it keeps them all busy (0, 1]; the
  /// rest goes to the operating system's switches and the other processes' wake-ups and uneven
  /// spreading, which a device to spare absorbs (`troupe calibrate` measures it for this
  /// machine).
  double time_slice_efficiency = 1;
  /// The spread of a piece of work's duration: the standard deviation of its logarithm (each
  /// piece takes its modelled time times e^N(−σ²/2, σ²) with σ = work_jitter, which keeps its
  /// mean, drawn with the simulation's seed). This machine's passes vary by 4–13 %; the spread
  /// decides which of a pipeline's possible orders of passes takes hold, and so the keys'
  /// staleness. 0: every piece the same.
  double work_jitter = 0;
};

struct link_model {
  std::string name;  ///< e.g. "node0/gpu1 egress", "node2 nic ingress", "switch1 uplink"
  double latency_s = 0;
  double bandwidth = 0;  ///< bytes/s
};

struct node_model {
  std::string name;
  std::vector<int> devices;  ///< indices into cluster_model::devices
  int nic_egress = -1;       ///< link indices
  int nic_ingress = -1;
  int switch_index = 0;
};

struct cluster_model {
  static constexpr int host_device = -1;

  std::string name;
  std::vector<device_model> devices;
  std::vector<node_model> nodes;
  std::vector<link_model> links;
  std::vector<int> device_egress;   ///< link index per device
  std::vector<int> device_ingress;  ///< link index per device
  std::vector<int> switch_uplink;   ///< link index per switch (empty with one switch)
  std::vector<int> switch_downlink;
  /// Extra latency of each switch hop, seconds.
  double switch_latency_s = 0;
  /// Where checkpoints go ([storage]): bytes/s at which shards are written and read back, and
  /// the fixed cost of one checkpoint (manifest, fsync, rename). Bandwidth 0: checkpoints cost
  /// no time.
  double storage_bandwidth = 0;
  double storage_latency_s = 0;
  /// Device of each stage from the file's [placement] stages (names); empty: stage i goes to
  /// device i.
  std::vector<int> placement;

  /// The links a message crosses from device `from` to device `to` (either may be
  /// host_device), in order.
  std::vector<int> path(int from, int to) const;
  /// Sum of the path's link latencies plus switch_latency_s for each switch it passes (1 across
  /// nodes of one switch, 3 across switches: leaf, spine, leaf). `links` is as path() returns
  /// it: the switches passed are read from its length.
  double path_latency_s(const std::vector<int>& links) const;
  /// The device of stage `stage` of a `stages`-stage job: the placement's entry when the file
  /// has one (its length must equal `stages`), otherwise device `stage` when there are at
  /// least as many devices as stages, else device stage × devices / stages (neighbouring
  /// stages share a device). -1, with `error` naming the placement, when the placement's
  /// length differs from `stages`.
  int device_of_stage(int stage, int stages, std::string* error) const;
};

/// Parses a cluster file's text; nothing, with `error` one line naming `source` and the bad
/// field (missing bandwidth, negative latency, unknown device type, placement naming a device
/// that does not exist, an unknown key), otherwise.
std::optional<cluster_model> parse_cluster(const std::string& text, const std::string& source,
                                           std::string* error);
std::optional<cluster_model> load_cluster_file(const std::string& path, std::string* error);

}  // namespace troupe::sim
