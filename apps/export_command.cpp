// `troupe export CHECKPOINT --format safetensors OUT`: a checkpoint's weights in a file that
// other tools (PyTorch, JAX, Hugging Face) read, and that model.init_from reads back.

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine/stage_state.h"
#include "actors/storage/checkpoint_store.h"
#include "actors/storage/safetensors.h"
#include "apps/commands.h"

namespace troupe::apps {
namespace {

/// Every shard of `checkpoint` parsed, in stage order; nothing, with `error` naming the shard's
/// file, when one does not parse or holds another stage than its place says.
std::optional<std::vector<actors::stage_state>> parse_shards(
    const actors::loaded_checkpoint& checkpoint, std::string* error) {
  std::vector<actors::stage_state> states;
  for (size_t i = 0; i < checkpoint.shards.size(); ++i) {
    const std::string file =
        checkpoint.directory + "/" +
        (i < checkpoint.manifest.shards.size() ? checkpoint.manifest.shards[i].file
                                               : "stage-" + std::to_string(i) + ".shard");
    std::string problem;
    auto state = actors::parse_stage_state(checkpoint.shards[i].data(), checkpoint.shards[i].size(),
                                           &problem);
    if (state && state->stage != static_cast<int32_t>(i)) {
      problem = "it holds stage " + std::to_string(state->stage) + " in place of stage " +
                std::to_string(i);
      state.reset();
    }
    if (!state) {
      *error = file + ": " + problem;
      return std::nullopt;
    }
    states.push_back(std::move(*state));
  }
  return states;
}

int64_t parameter_count(const std::vector<actors::named_tensor>& tensors) {
  int64_t count = 0;
  for (const actors::named_tensor& tensor : tensors)
    count += static_cast<int64_t>(tensor.values.size());
  return count;
}

}  // namespace

int run_export(const export_options& options) {
  if (options.format != "safetensors") {
    std::fprintf(stderr, "troupe export: unknown format %s (troupe writes safetensors)\n",
                 options.format.c_str());
    return 2;
  }
  std::vector<std::string> problems;
  std::string error;
  auto checkpoint = actors::resolve_resume(options.checkpoint, "", &problems, &error);
  for (const std::string& problem : problems) {
    std::fprintf(stderr, "troupe export: skipped %s\n", problem.c_str());
  }
  std::optional<std::vector<actors::stage_state>> states;
  if (checkpoint) states = parse_shards(*checkpoint, &error);
  if (!states) {
    std::fprintf(stderr, "troupe export: %s\n", error.c_str());
    return 2;
  }
  const std::vector<actors::named_tensor> tensors = actors::export_tensors(*states);
  const std::string step = std::to_string(checkpoint->manifest.step);
  const std::map<std::string, std::string> metadata = {
      {"producer", "troupe"}, {"step", step}, {"config_hash", checkpoint->manifest.config_hash}};
  if (!actors::write_safetensors(options.out, tensors, metadata, &error)) {
    std::fprintf(stderr, "troupe export: %s\n", error.c_str());
    return 1;
  }
  std::printf("wrote %zu tensors (%lld parameters) of step %s to %s\n", tensors.size(),
              static_cast<long long>(parameter_count(tensors)), step.c_str(), options.out.c_str());
  return 0;
}

}  // namespace troupe::apps
