#include "sim/cluster_model.h"

#include "layers/check.h"

namespace troupe::sim {

std::vector<int> cluster_model::path(int from, int to) const {
  const auto valid = [this](int device) {
    return device == host_device || (device >= 0 && device < static_cast<int>(devices.size()));
  };
  TROUPE_CHECK(valid(from) && valid(to) && !nodes.empty());
  if (from == to) return {};
  const int from_node = from == host_device ? 0 : devices[from].node;
  const int to_node = to == host_device ? 0 : devices[to].node;
  std::vector<int> links_crossed;
  if (from != host_device) links_crossed.push_back(device_egress[from]);
  if (from_node != to_node) {
    const int from_switch = nodes[from_node].switch_index;
    const int to_switch = nodes[to_node].switch_index;
    links_crossed.push_back(nodes[from_node].nic_egress);
    if (from_switch != to_switch) {
      links_crossed.push_back(switch_uplink[from_switch]);
      links_crossed.push_back(switch_downlink[to_switch]);
    }
    links_crossed.push_back(nodes[to_node].nic_ingress);
  }
  if (to != host_device) links_crossed.push_back(device_ingress[to]);
  return links_crossed;
}

double cluster_model::path_latency_s(const std::vector<int>& path_links) const {
  double latency = 0;
  for (int link : path_links) {
    TROUPE_CHECK(link >= 0 && link < static_cast<int>(links.size()));
    latency += links[link].latency_s;
  }
  // path() keeps a message inside its node with at most two links (a device egress and
  // ingress); three or four leave the node through one leaf switch; five or six also cross the
  // spine (leaf, spine, leaf).
  const size_t length = path_links.size();
  const int switches = length >= 5 ? 3 : length >= 3 ? 1 : 0;
  return latency + switches * switch_latency_s;
}

int cluster_model::device_of_stage(int stage, int stages, std::string* error) const {
  TROUPE_CHECK(stage >= 0 && stage < stages && !devices.empty());
  if (!placement.empty()) {
    if (placement.size() == static_cast<size_t>(stages)) return placement[stage];
    if (error != nullptr) {
      *error = "cluster " + name + ": placement.stages names " + std::to_string(placement.size()) +
               " devices but the job has " + std::to_string(stages) + " stages";
    }
    return -1;
  }
  const int64_t count = static_cast<int64_t>(devices.size());
  if (count >= stages) return stage;
  return static_cast<int>(int64_t{stage} * count / stages);
}

}  // namespace troupe::sim
