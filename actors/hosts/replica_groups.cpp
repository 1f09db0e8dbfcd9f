#include "actors/hosts/replica_groups.h"

#include <map>

#include "actors/engine/stage_settings.h"
#include "layers/backend_registry.h"

namespace troupe::actors {
namespace {

/// "cuda" is device 0.
std::string device_name(const std::string& device) { return device == "cuda" ? "cuda:0" : device; }

std::string quoted(const std::string& text) { return "\"" + text + "\""; }

}  // namespace

bool uses_replica_groups(const job_config& config) {
  return config.parallelism.replicas > 1 && config.parallelism.collective != collective_kind::ring;
}

std::string replica_group_problem(const job_config& config, bool one_process) {
  if (!uses_replica_groups(config)) return "";
  const parallelism_config& p = config.parallelism;
  const std::string key = "parallelism.collective = " + quoted(to_string(p.collective));
  if (p.collective == collective_kind::shared_memory) {
    if (one_process) return "";
    return key +
           " sums the replicas in one process: run without --workers or a launcher, or "
           "use \"ring\"";
  }
  if (!layers::nccl_compiled()) {
    return key +
           ": this build of troupe has no NCCL (it needs the CUDA toolkit's NCCL when "
           "configured); use \"ring\"";
  }
  if (!one_process) return "";  // NCCL itself refuses two ranks on one GPU of a node
  for (int stage = 0; stage < p.stages; ++stage) {
    std::map<std::string, int> replica_on;
    for (int replica = 0; replica < p.replicas; ++replica) {
      const std::string device = device_name(device_of_actor(config, replica * p.stages + stage));
      const auto [place, fresh] = replica_on.emplace(device, replica);
      if (!fresh) {
        return key + ": replicas " + std::to_string(place->second) + " and " +
               std::to_string(replica) + " of stage " + std::to_string(stage) +
               " would both run on " + device +
               ", and NCCL needs a GPU of its own per replica: give parallelism.devices one "
               "device per stage of every replica (" +
               std::to_string(p.stages * p.replicas) + " entries), or use \"ring\"";
      }
    }
  }
  return "";
}

std::vector<std::string> make_replica_group_ids(const job_config& config, std::string* error) {
  std::vector<std::string> ids;
  const bool nccl = config.parallelism.collective == collective_kind::nccl;
  if (!uses_replica_groups(config) || !nccl) return ids;
  for (int stage = 0; stage < config.parallelism.stages; ++stage) {
    ids.push_back(layers::make_nccl_group_id(error));
    if (ids.back().empty()) return {};
  }
  return ids;
}

bool join_replica_groups(const job_config& config,
                         const std::vector<std::shared_ptr<stage_parts>>& parts,
                         const std::vector<std::string>& group_ids, double timeout_s,
                         std::string* error) {
  if (!uses_replica_groups(config)) return true;
  const int replicas = config.parallelism.replicas;
  if (config.parallelism.collective == collective_kind::shared_memory) {
    std::map<int, std::vector<std::shared_ptr<stage_parts>>> by_stage;
    for (const auto& stage : parts) by_stage[stage_of_actor(config, stage->index)].push_back(stage);
    for (auto& [stage, peers] : by_stage) {
      if (static_cast<int>(peers.size()) != replicas) {
        *error = "parallelism.collective = \"shared_memory\": this process holds " +
                 std::to_string(peers.size()) + " of the " + std::to_string(replicas) +
                 " replicas of stage " + std::to_string(stage) + "; it needs all of them";
        return false;
      }
      auto group = layers::make_shared_memory_group(replicas);
      for (const auto& peer : peers) {
        const int replica = replica_of_actor(config, peer->index);
        peer->logic->use_replica_group(std::move(group[replica]));
      }
    }
    return true;
  }
  if (group_ids.size() != static_cast<size_t>(config.parallelism.stages)) {
    *error = "parallelism.collective = \"nccl\": " + std::to_string(group_ids.size()) +
             " NCCL group ids for " + std::to_string(config.parallelism.stages) + " stages";
    return false;
  }
  std::vector<layers::nccl_member> members;
  for (const auto& stage : parts) {
    members.push_back({stage->backend.get(), group_ids[stage_of_actor(config, stage->index)],
                       replica_of_actor(config, stage->index), replicas});
  }
  std::string why;
  auto groups = layers::join_nccl_groups(members, timeout_s, &why);
  if (groups.empty()) {
    *error = "the replicas' NCCL groups did not form: " + why;
    return false;
  }
  for (size_t i = 0; i < parts.size(); ++i)
    parts[i]->logic->use_replica_group(std::move(groups[i]));
  return true;
}

}  // namespace troupe::actors
