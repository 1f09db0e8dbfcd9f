#include "actors/storage/checkpoint_recut.h"

#include <map>
#include <set>
#include <utility>
#include <vector>

#include "actors/config/layer_cuts.h"
#include "actors/engine/partition.h"
#include "actors/engine/stage_state.h"
#include "actors/storage/model_weights.h"
#include "layers/tensor.h"

namespace troupe::actors {
namespace {

/// Whole-model tensors by name: a tensor that several stages hold part of (a cut layer's
/// weight, bias or optimizer state) joined in stage order.
class whole_tensors {
 public:
  bool add(named_tensor&& part, std::string* error) {
    auto existing = tensors_.find(part.name);
    if (existing == tensors_.end()) {
      tensors_.emplace(part.name, std::move(part));
      return true;
    }
    named_tensor& whole = existing->second;
    const bool fits = !whole.dims.empty() && whole.dims.size() == part.dims.size() &&
                      std::equal(whole.dims.begin() + 1, whole.dims.end(), part.dims.begin() + 1);
    if (!fits) {
      *error = "the parts of " + part.name + " have shapes " + layers::to_string(whole.dims) +
               " and " + layers::to_string(part.dims) + ", which do not join by rows";
      return false;
    }
    whole.dims[0] += part.dims[0];
    whole.values.insert(whole.values.end(), part.values.begin(), part.values.end());
    return true;
  }

  /// Fills `target` (its name and shape set) from the whole tensor of its name; `rows` (the
  /// part's first row and the layer's rows) where the new partition cuts its layer.
  bool fill(named_tensor* target, const std::pair<int64_t, int64_t>* rows, std::string* error) {
    auto found = tensors_.find(target->name);
    if (found == tensors_.end()) {
      *error = "the checkpoint holds no " + target->name;
      return false;
    }
    used_.insert(target->name);
    const named_tensor& whole = found->second;
    layers::shape expected = target->dims;
    if (rows != nullptr && !expected.empty()) expected[0] = rows->second;
    if (whole.dims != expected) {
      *error = target->name + " has shape " + layers::to_string(whole.dims) +
               " in the checkpoint, where the model's is " + layers::to_string(expected);
      return false;
    }
    const int64_t row_width =
        expected.empty() || expected[0] == 0 ? 0 : layers::element_count(expected) / expected[0];
    const auto begin = whole.values.begin() + (rows ? rows->first * row_width : 0);
    target->values.assign(begin, begin + layers::element_count(target->dims));
    return true;
  }

  /// The tensors that no target took, named (at most five).
  std::string unused() const {
    std::string names;
    int count = 0;
    for (const auto& [name, tensor] : tensors_) {
      if (used_.count(name) || ++count > 5) continue;
      names += (count > 1 ? ", " : "") + name;
    }
    return names;
  }

 private:
  std::map<std::string, named_tensor> tensors_;
  std::set<std::string> used_;
};

/// The suffixes of the optimizer tensors of each parameter (".velocity"; ".exp_avg" and
/// ".exp_avg_sq"), by parameter name.
std::map<std::string, std::vector<std::string>> optimizer_suffixes(const stage_state& state) {
  std::map<std::string, std::vector<std::string>> suffixes;
  for (const named_tensor& extra : state.optimizer_state) {
    for (const named_tensor& parameter : state.parameters) {
      const std::string& name = parameter.name;
      if (extra.name.size() > name.size() + 1 && extra.name.compare(0, name.size(), name) == 0 &&
          extra.name[name.size()] == '.') {
        suffixes[name].push_back(extra.name.substr(name.size()));
        break;
      }
    }
  }
  return suffixes;
}

std::optional<std::vector<stage_state>> parsed_stages(const loaded_checkpoint& checkpoint,
                                                      std::string* error) {
  std::vector<stage_state> stages;
  for (size_t i = 0; i < checkpoint.shards.size(); ++i) {
    std::string problem;
    auto state =
        parse_stage_state(checkpoint.shards[i].data(), checkpoint.shards[i].size(), &problem);
    if (!state) {
      *error = checkpoint.directory + ": stage " + std::to_string(i) + "'s shard: " + problem;
      return std::nullopt;
    }
    stages.push_back(std::move(*state));
  }
  if (stages.empty()) {
    *error = checkpoint.directory + ": no shards";
    return std::nullopt;
  }
  return stages;
}

/// Why the stages cannot be joined into one model at one point of training; "" when they can.
std::string disagreement(const std::vector<stage_state>& stages) {
  for (const stage_state& state : stages) {
    const stage_state& first = stages.front();
    const std::string which = "stage " + std::to_string(state.stage);
    if (state.weight_version != first.weight_version ||
        state.optimizer_steps != first.optimizer_steps) {
      return which + " is at weight version " + std::to_string(state.weight_version) +
             " where stage 0 is at " + std::to_string(first.weight_version) +
             " (an asynchronous pipeline's stages step on their own)";
    }
    if (state.keys_since_step != 0 || !state.gradients.empty()) {
      return which + " holds gradients of " + std::to_string(state.keys_since_step) +
             " keys towards its next step";
    }
  }
  return "";
}

}  // namespace

bool needs_recut(const loaded_checkpoint& checkpoint, const job_config& config) {
  if (checkpoint.manifest.stages != config.parallelism.stages) return true;
  std::string ignored;
  const auto ranges = partition_model(config, &ignored);
  if (!ranges || ranges->size() != checkpoint.shards.size()) return false;
  for (size_t i = 0; i < ranges->size(); ++i) {
    const auto state = parse_stage_state_counters(checkpoint.shards[i].data(),
                                                  checkpoint.shards[i].size(), &ignored);
    if (state && (state->first_block != static_cast<int64_t>((*ranges)[i].first) ||
                  state->last_block != static_cast<int64_t>((*ranges)[i].last)))
      return true;
  }
  return false;
}

std::optional<loaded_checkpoint> recut_checkpoint(const loaded_checkpoint& checkpoint,
                                                  const job_config& config, std::string* error) {
  auto old_stages = parsed_stages(checkpoint, error);
  if (!old_stages) return std::nullopt;
  const std::string refusal = disagreement(*old_stages);
  if (!refusal.empty()) {
    *error = checkpoint.directory + " cannot be cut into other stages: " + refusal +
             "; resume it with its own " + std::to_string(old_stages->size()) + " stages";
    return std::nullopt;
  }
  whole_tensors whole;
  std::map<std::string, std::vector<std::string>> suffixes;
  for (stage_state& state : *old_stages) {
    for (auto& [name, list] : optimizer_suffixes(state)) suffixes[name] = list;
    for (auto* group : {&state.parameters, &state.optimizer_state}) {
      for (named_tensor& tensor : *group) {
        if (!whole.add(std::move(tensor), error)) return std::nullopt;
      }
    }
  }
  // The new partition's stages, their parameters named and shaped (their values come next).
  auto states = seeded_stage_states(config, error);
  if (!states) return std::nullopt;
  loaded_checkpoint recut = checkpoint;
  recut.shards.clear();
  recut.manifest.shards.clear();
  recut.manifest.stages = static_cast<int32_t>(states->size());
  const stage_state& model = old_stages->front();
  for (stage_state& state : *states) {
    state.weight_version = model.weight_version;
    state.optimizer_steps = model.optimizer_steps;
    state.seed = model.seed;
    const auto cut_rows = cut_layer_rows(config, static_cast<size_t>(state.first_block),
                                         static_cast<size_t>(state.last_block));
    for (const named_tensor& parameter : state.parameters) {
      for (const std::string& suffix : suffixes[parameter.name]) {
        state.optimizer_state.push_back({parameter.name + suffix, parameter.dims, {}});
      }
    }
    for (auto* group : {&state.parameters, &state.optimizer_state}) {
      for (named_tensor& tensor : *group) {
        const auto rows = cut_rows.find(tensor.name.substr(0, tensor.name.find('.')));
        if (!whole.fill(&tensor, rows == cut_rows.end() ? nullptr : &rows->second, error)) {
          *error = checkpoint.directory + ": " + *error;
          return std::nullopt;
        }
      }
    }
    recut.shards.push_back(serialize_stage_state(state));
    const std::string& bytes = recut.shards.back();
    recut.manifest.shards.push_back({state.stage, "stage-" + std::to_string(state.stage) + ".shard",
                                     bytes.size(), xxh3_hex(bytes.data(), bytes.size())});
  }
  const std::string unused = whole.unused();
  if (!unused.empty()) {
    *error = checkpoint.directory + " holds tensors that are not the model's: " + unused;
    return std::nullopt;
  }
  return recut;
}

}  // namespace troupe::actors
