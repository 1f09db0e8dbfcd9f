#include "sim/cluster_model.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace troupe::sim {
namespace {

constexpr int kHost = cluster_model::host_device;

cluster_model example(const std::string& file) {
  std::string error;
  auto cluster =
      load_cluster_file(std::string(TROUPE_SOURCE_DIR) + "/apps/examples/" + file, &error);
  EXPECT_TRUE(cluster) << error;
  return cluster ? *cluster : cluster_model{};
}

cluster_model parsed(const std::string& text) {
  std::string error;
  auto cluster = parse_cluster(text, "test.toml", &error);
  EXPECT_TRUE(cluster) << error;
  return cluster ? *cluster : cluster_model{};
}

/// The names of the links a message from `from` to `to` crosses.
std::vector<std::string> path_names(const cluster_model& cluster, int from, int to) {
  std::vector<std::string> names;
  for (int link : cluster.path(from, to)) names.push_back(cluster.links[link].name);
  return names;
}

/// Three nodes of two devices, two nodes per switch: every kind of path, with latencies that
/// tell the links apart (device ports 1 µs, NICs 10 µs, switches 1 ms).
const char* const kThreeNodes = R"(
[device_types.t]
peak_flops = 1e12
memory_bandwidth = 1e11
memory_bytes = 1e9
[[nodes]]
name = "n"
count = 3
device_type = "t"
devices = 2
device_link = { latency_s = 1e-6, bandwidth = 10 }
nic = { latency_s = 1e-5, bandwidth = 4 }
[network]
nodes_per_switch = 2
oversubscription = 2
switch_latency_s = 1e-3
)";

/// A valid file that the error tests below break one field at a time.
const std::string kBase = R"(
[device_types.h100]
peak_flops = 4e14
memory_bandwidth = 3.35e12
memory_bytes = 8e10

[[nodes]]
name = "node"
count = 16
device_type = "h100"
devices = 4
device_link = { latency_s = 3e-6, bandwidth = 2.5e10 }
nic = { latency_s = 1e-5, bandwidth = 1.25e10 }
)";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

/// The one-line error of parsing `text` as "c.toml", which must fail.
std::string error_of(const std::string& text) {
  std::string error;
  EXPECT_FALSE(parse_cluster(text, "c.toml", &error));
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  return error;
}

TEST(ClusterModelTest, DgxExampleHasEightGpusOnOneNode) {
  const cluster_model cluster = example("cluster_dgx_node.toml");
  ASSERT_EQ(cluster.devices.size(), 8u);
  EXPECT_EQ(cluster.nodes.size(), 1u);
  EXPECT_EQ(cluster.links.size(), 8u * 2 + 2);  // device ports and one NIC; no switch links
  EXPECT_TRUE(cluster.switch_uplink.empty());
  EXPECT_EQ(cluster.devices[7].name, "node0/gpu7");
  EXPECT_EQ(cluster.devices[7].type, "h100");
  EXPECT_DOUBLE_EQ(cluster.devices[0].peak_flops, 4.0e14);
  EXPECT_DOUBLE_EQ(cluster.devices[0].efficiency, 0.6);
  EXPECT_DOUBLE_EQ(cluster.links[cluster.device_egress[3]].bandwidth, 4.5e11);
}

TEST(ClusterModelTest, EthernetExampleHasSixteenNodesOnTwoSwitches) {
  const cluster_model cluster = example("cluster_ethernet_16_nodes.toml");
  ASSERT_EQ(cluster.devices.size(), 64u);
  ASSERT_EQ(cluster.nodes.size(), 16u);
  EXPECT_EQ(cluster.links.size(), 64u * 2 + 16 * 2 + 2 * 2);
  EXPECT_EQ(cluster.switch_uplink.size(), 2u);
  EXPECT_EQ(cluster.switch_downlink.size(), 2u);
  EXPECT_EQ(cluster.devices[63].name, "node15/gpu3");
  EXPECT_EQ(cluster.nodes[7].switch_index, 0);
  EXPECT_EQ(cluster.nodes[8].switch_index, 1);
  EXPECT_EQ(cluster.devices[63].node, 15);
}

TEST(ClusterModelTest, PooledIsAFlagOfADeviceType) {
  EXPECT_FALSE(parsed(kBase).devices.front().pooled);
  const cluster_model pooled =
      parsed(replaced(kBase, "peak_flops = 4e14", "peak_flops = 4e14\npooled = true"));
  EXPECT_TRUE(pooled.devices.front().pooled);
  EXPECT_EQ(error_of(replaced(kBase, "peak_flops = 4e14", "peak_flops = 4e14\npooled = 1")),
            "c.toml: device_types.h100.pooled: must be a boolean, got an integer");
  EXPECT_FALSE(parsed(kBase).devices.front().time_sliced);
  const cluster_model sliced = parsed(
      replaced(kBase, "peak_flops = 4e14", "peak_flops = 4e14\npooled = true\ntime_sliced = true"));
  EXPECT_TRUE(sliced.devices.front().time_sliced);
  EXPECT_EQ(error_of(replaced(kBase, "peak_flops = 4e14", "peak_flops = 4e14\ntime_sliced = true")),
            "c.toml: device_types.h100.time_sliced: needs pooled = true (a pool to share)");
  EXPECT_EQ(sliced.devices.front().time_slice_efficiency, 1.0);
  const std::string pool = "peak_flops = 4e14\npooled = true\ntime_sliced = true";
  EXPECT_EQ(parsed(replaced(kBase, "peak_flops = 4e14", pool + "\ntime_slice_efficiency = 0.8"))
                .devices.front()
                .time_slice_efficiency,
            0.8);
  EXPECT_EQ(error_of(replaced(kBase, "peak_flops = 4e14", pool + "\ntime_slice_efficiency = 0")),
            "c.toml: device_types.h100.time_slice_efficiency: must be in (0, 1], got 0");
  EXPECT_EQ(error_of(replaced(kBase, "peak_flops = 4e14",
                              "peak_flops = 4e14\npooled = true\ntime_slice_efficiency = 0.8")),
            "c.toml: device_types.h100.time_slice_efficiency: needs time_sliced = true");
}

TEST(ClusterModelTest, ThisMachineExampleHasTwoCpus) {
  const cluster_model cluster = example("cluster_this_machine.toml");
  ASSERT_EQ(cluster.devices.size(), 2u);
  EXPECT_EQ(cluster.nodes.size(), 1u);
  EXPECT_EQ(cluster.links.size(), 6u);
  EXPECT_EQ(cluster.devices[1].name, "this-machine/cpu1");
  EXPECT_TRUE(cluster.devices[1].pooled);
  EXPECT_EQ(cluster.name, "this machine");
}

TEST(ClusterModelTest, NameDefaultsToTheFileStem) {
  std::string error;
  auto cluster = parse_cluster(kBase, "configs/my_cluster.toml", &error);
  ASSERT_TRUE(cluster) << error;
  EXPECT_EQ(cluster->name, "my_cluster");
  EXPECT_EQ(cluster->devices[0].launch_overhead_s, 0);  // defaults
  EXPECT_EQ(cluster->devices[0].efficiency, 1);
  EXPECT_EQ(cluster->nodes[15].name, "node15");
}

TEST(ClusterModelTest, PathsCrossTheDocumentedLinksInOrder) {
  const cluster_model cluster = parsed(kThreeNodes);
  ASSERT_EQ(cluster.devices.size(), 6u);
  EXPECT_TRUE(cluster.path(3, 3).empty());
  EXPECT_EQ(path_names(cluster, 0, 1),
            (std::vector<std::string>{"n0/gpu0 egress", "n0/gpu1 ingress"}));
  EXPECT_EQ(path_names(cluster, 1, 2),
            (std::vector<std::string>{"n0/gpu1 egress", "n0 nic egress", "n1 nic ingress",
                                      "n1/gpu0 ingress"}));
  EXPECT_EQ(path_names(cluster, 3, 5),
            (std::vector<std::string>{"n1/gpu1 egress", "n1 nic egress", "switch0 uplink",
                                      "switch1 downlink", "n2 nic ingress", "n2/gpu1 ingress"}));
  EXPECT_EQ(path_names(cluster, 5, 0),
            (std::vector<std::string>{"n2/gpu1 egress", "n2 nic egress", "switch1 uplink",
                                      "switch0 downlink", "n0 nic ingress", "n0/gpu0 ingress"}));
}

TEST(ClusterModelTest, PathLatencyAddsLinksAndSwitchHops) {
  const cluster_model cluster = parsed(kThreeNodes);
  EXPECT_DOUBLE_EQ(cluster.path_latency_s(cluster.path(2, 2)), 0);
  EXPECT_DOUBLE_EQ(cluster.path_latency_s(cluster.path(0, 1)), 2e-6);
  EXPECT_DOUBLE_EQ(cluster.path_latency_s(cluster.path(1, 2)), 2e-6 + 2e-5 + 1e-3);
  EXPECT_DOUBLE_EQ(cluster.path_latency_s(cluster.path(3, 5)), 2e-6 + 2e-5 + 3e-3);
}

TEST(ClusterModelTest, HostPathsHaveNoHostDevicePort) {
  const cluster_model cluster = parsed(kThreeNodes);
  EXPECT_TRUE(cluster.path(kHost, kHost).empty());
  EXPECT_EQ(path_names(cluster, kHost, 1), std::vector<std::string>{"n0/gpu1 ingress"});
  EXPECT_EQ(path_names(cluster, 0, kHost), std::vector<std::string>{"n0/gpu0 egress"});
  EXPECT_EQ(path_names(cluster, kHost, 3),
            (std::vector<std::string>{"n0 nic egress", "n1 nic ingress", "n1/gpu1 ingress"}));
  EXPECT_EQ(path_names(cluster, 4, kHost),
            (std::vector<std::string>{"n2/gpu0 egress", "n2 nic egress", "switch1 uplink",
                                      "switch0 downlink", "n0 nic ingress"}));
  EXPECT_DOUBLE_EQ(cluster.path_latency_s(cluster.path(kHost, 1)), 1e-6);
  EXPECT_DOUBLE_EQ(cluster.path_latency_s(cluster.path(kHost, 3)), 1e-6 + 2e-5 + 1e-3);
  EXPECT_DOUBLE_EQ(cluster.path_latency_s(cluster.path(4, kHost)), 1e-6 + 2e-5 + 3e-3);
}

TEST(ClusterModelTest, OversubscriptionDividesUplinkBandwidth) {
  const cluster_model ethernet = example("cluster_ethernet_16_nodes.toml");
  ASSERT_EQ(ethernet.switch_uplink.size(), 2u);
  EXPECT_DOUBLE_EQ(ethernet.links[ethernet.switch_uplink[1]].bandwidth, 8 * 1.25e10 / 2);
  EXPECT_DOUBLE_EQ(ethernet.links[ethernet.switch_downlink[0]].bandwidth, 8 * 1.25e10 / 2);
  // The last switch holds one node; its ports are still sized for nodes_per_switch NICs.
  const cluster_model three = parsed(kThreeNodes);
  EXPECT_DOUBLE_EQ(three.links[three.switch_uplink[1]].bandwidth, 2 * 4.0 / 2);
  const cluster_model full = parsed(replaced(kThreeNodes, "oversubscription = 2", ""));
  EXPECT_DOUBLE_EQ(full.links[full.switch_uplink[0]].bandwidth, 2 * 4.0);
}

TEST(ClusterModelTest, UplinksUseTheMeanNicBandwidthOfTheirNodes) {
  const std::string text = kBase + R"(
[[nodes]]
name = "fat"
device_type = "h100"
devices = 1
device_link = { bandwidth = 1e10 }
nic = { bandwidth = 2.5e10 }
[network]
nodes_per_switch = 2
)";
  const cluster_model cluster = parsed(replaced(text, "count = 16", "count = 3"));
  ASSERT_EQ(cluster.switch_uplink.size(), 2u);  // node0 node1 | node2 fat
  EXPECT_DOUBLE_EQ(cluster.links[cluster.switch_uplink[0]].bandwidth, 2 * 1.25e10);
  EXPECT_DOUBLE_EQ(cluster.links[cluster.switch_uplink[1]].bandwidth, 2 * (1.25e10 + 2.5e10) / 2);
}

TEST(ClusterModelTest, OneSwitchHasNoUplinks) {
  const cluster_model cluster = parsed(kBase);
  EXPECT_TRUE(cluster.switch_uplink.empty());
  EXPECT_TRUE(cluster.switch_downlink.empty());
  EXPECT_EQ(cluster.nodes[15].switch_index, 0);
  EXPECT_EQ(cluster.path(0, 63).size(), 4u);
}

TEST(ClusterModelTest, StagesGoToTheirOwnDevicesWhenThereAreEnough) {
  const cluster_model cluster = example("cluster_dgx_node.toml");
  std::string error;
  for (int stage = 0; stage < 8; ++stage)
    EXPECT_EQ(cluster.device_of_stage(stage, 8, &error), stage);
  EXPECT_EQ(cluster.device_of_stage(2, 3, &error), 2);
  EXPECT_EQ(error, "");
}

TEST(ClusterModelTest, NeighbouringStagesShareADeviceWhenThereAreFewer) {
  const cluster_model two = example("cluster_this_machine.toml");
  std::vector<int> devices;
  for (int stage = 0; stage < 4; ++stage) devices.push_back(two.device_of_stage(stage, 4, nullptr));
  EXPECT_EQ(devices, (std::vector<int>{0, 0, 1, 1}));
  const cluster_model three = parsed(replaced(kBase, "count = 16", "count = 3"));
  ASSERT_EQ(three.devices.size(), 12u);
  devices.clear();
  for (int stage = 0; stage < 16; ++stage)
    devices.push_back(three.device_of_stage(stage, 16, nullptr));
  EXPECT_EQ(devices, (std::vector<int>{0, 0, 1, 2, 3, 3, 4, 5, 6, 6, 7, 8, 9, 9, 10, 11}));
}

TEST(ClusterModelTest, PlacementNamesEachStageDevice) {
  const cluster_model cluster =
      parsed(kBase + "[placement]\nstages = [\"node3/gpu1\", \"node0/gpu0\", \"node3/gpu1\"]\n");
  ASSERT_EQ(cluster.placement, (std::vector<int>{13, 0, 13}));
  std::string error;
  EXPECT_EQ(cluster.device_of_stage(0, 3, &error), 13);
  EXPECT_EQ(cluster.device_of_stage(1, 3, &error), 0);
  EXPECT_EQ(cluster.device_of_stage(2, 3, &error), 13);
  EXPECT_EQ(cluster.device_of_stage(1, 4, &error), -1);
  EXPECT_NE(error.find("placement"), std::string::npos) << error;
  EXPECT_NE(error.find("4 stages"), std::string::npos) << error;
}

TEST(ClusterModelTest, BaseFileOfTheErrorTestsParses) {
  const cluster_model cluster = parsed(kBase);
  EXPECT_EQ(cluster.devices.size(), 64u);
}

TEST(ClusterModelTest, MissingBandwidthIsNamed) {
  EXPECT_EQ(error_of(replaced(kBase, "latency_s = 1e-5, bandwidth = 1.25e10", "latency_s = 1e-5")),
            "c.toml: nodes[0].nic.bandwidth: missing (bytes/s, > 0)");
}

TEST(ClusterModelTest, NegativeLatencyIsNamed) {
  const std::string second = R"(
[[nodes]]
name = "extra"
device_type = "h100"
devices = 1
device_link = { latency_s = -1, bandwidth = 1e10 }
nic = { bandwidth = 1e10 }
)";
  EXPECT_EQ(error_of(kBase + second),
            "c.toml: nodes[1].device_link.latency_s: must be >= 0, got -1");
}

TEST(ClusterModelTest, NonPositivePeakFlopsIsNamed) {
  EXPECT_EQ(error_of(replaced(kBase, "peak_flops = 4e14", "peak_flops = 0")),
            "c.toml: device_types.h100.peak_flops: must be > 0, got 0");
}

TEST(ClusterModelTest, UnknownDeviceTypeIsNamed) {
  EXPECT_EQ(error_of(replaced(kBase, "device_type = \"h100\"", "device_type = \"a100\"")),
            "c.toml: nodes[0].device_type: no device type named \"a100\" (have: h100)");
}

TEST(ClusterModelTest, PlacementOfAMissingDeviceIsNamed) {
  const std::string text =
      kBase +
      "[placement]\nstages = [\"node0/gpu0\", \"node0/gpu1\", \"node1/gpu0\", \"node9/gpu4\"]\n";
  EXPECT_EQ(error_of(text),
            "c.toml: placement.stages[3]: no device named \"node9/gpu4\" (devices node0/gpu0 "
            "... node15/gpu3)");
}

TEST(ClusterModelTest, UnknownKeyGetsASuggestion) {
  EXPECT_EQ(error_of(replaced(kBase, "devices = 4", "devicez = 4")),
            "c.toml: nodes[0].devicez: unknown key (did you mean devices?)");
  const std::string far = error_of(kBase + "[network]\nbandwidth = 1\n");
  EXPECT_NE(far.find("network.bandwidth: unknown key (known keys: nodes_per_switch"),
            std::string::npos)
      << far;
}

TEST(ClusterModelTest, SyntaxErrorGivesTheLine) {
  const std::string error =
      error_of(replaced(kBase, "memory_bytes = 8e10", "memory_bytes = = 8e10"));
  EXPECT_EQ(error.rfind("c.toml:5:", 0), 0u) << error;
}

TEST(ClusterModelTest, WrongValueTypesAreNamed) {
  std::string error = error_of(replaced(kBase, "devices = 4", "devices = \"four\""));
  EXPECT_EQ(error, "c.toml: nodes[0].devices: must be an integer, got a string");
  error = error_of(replaced(kBase, "peak_flops = 4e14", "peak_flops = \"fast\""));
  EXPECT_EQ(error, "c.toml: device_types.h100.peak_flops: must be a number, got a string");
  error = error_of(replaced(kBase, "nic = { latency_s = 1e-5, bandwidth = 1.25e10 }", "nic = 5"));
  EXPECT_NE(error.find("c.toml: nodes[0].nic: must be a table"), std::string::npos) << error;
}

TEST(ClusterModelTest, OutOfRangeValuesAreNamed) {
  EXPECT_NE(error_of(kBase + "[network]\noversubscription = 0.5\n")
                .find("c.toml: network.oversubscription: must be >= 1, got 0.5"),
            std::string::npos);
  EXPECT_NE(
      error_of(replaced(kBase, "memory_bytes = 8e10", "memory_bytes = 8e10\nefficiency = 1.5"))
          .find("device_types.h100.efficiency: must be in (0, 1], got 1.5"),
      std::string::npos);
  EXPECT_NE(error_of(replaced(kBase, "count = 16", "count = 0")).find("nodes[0].count: must be"),
            std::string::npos);
  const std::string huge =
      replaced(replaced(kBase, "count = 16", "count = 100000"), "devices = 4", "devices = 1000");
  EXPECT_EQ(error_of(huge), "c.toml: nodes[0]: makes 100000000 devices in all, more than 1048576");
}

TEST(ClusterModelTest, MissingSectionsAndDuplicateNodesAreNamed) {
  EXPECT_EQ(error_of("[[nodes]]\nname = \"a\"\n").rfind("c.toml: device_types: missing", 0), 0u);
  const std::string no_nodes = kBase.substr(0, kBase.find("[[nodes]]"));
  EXPECT_EQ(error_of(no_nodes).rfind("c.toml: nodes: missing", 0), 0u);
  const std::string twice = kBase + kBase.substr(kBase.find("[[nodes]]"));
  EXPECT_EQ(error_of(twice),
            "c.toml: nodes[1].name: node \"node0\" already exists (from nodes[0])");
}

TEST(ClusterModelTest, UnreadableFileNamesThePath) {
  std::string error;
  EXPECT_FALSE(load_cluster_file("/nonexistent/cluster.toml", &error));
  EXPECT_EQ(error.rfind("/nonexistent/cluster.toml: ", 0), 0u) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos);
  EXPECT_FALSE(load_cluster_file("/", &error));
  EXPECT_EQ(error.rfind("/: ", 0), 0u) << error;
}

}  // namespace
}  // namespace troupe::sim
