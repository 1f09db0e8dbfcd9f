// `troupe export CHECKPOINT --format safetensors OUT`: a checkpoint's weights in a file that
// other tools (PyTorch, JAX, Hugging Face) read, and that model.init_from reads back.
// `troupe export JOB.toml OUT --initial`: the weights a job starts from (its seed's draw).

#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/engine/stage_state.h"
#include "actors/storage/checkpoint_store.h"
#include "actors/storage/model_weights.h"
#include "actors/storage/safetensors.h"
#include "apps/cli/commands.h"
#include "apps/cli/model_files.h"

namespace troupe::apps {
namespace {

int64_t parameter_count(const std::vector<actors::named_tensor>& tensors) {
  int64_t count = 0;
  for (const actors::named_tensor& tensor : tensors)
    count += static_cast<int64_t>(tensor.values.size());
  return count;
}

/// The initial weights of the job `options.checkpoint` names.
int export_initial(const export_options& options) {
  actors::job_error problem;
  auto config = actors::load_job_file(options.checkpoint, options.overrides, &problem);
  std::string error = problem.message;
  std::optional<std::vector<actors::stage_state>> states;
  if (config) states = actors::seeded_stage_states(*config, &error);
  if (!states) {
    std::fprintf(stderr, "troupe export: %s\n", error.c_str());
    return 2;
  }
  const std::vector<actors::named_tensor> tensors = actors::export_tensors(*states);
  const std::map<std::string, std::string> metadata = {
      {"producer", "troupe"}, {"step", "0"}, {"config_hash", actors::config_hash(*config)}};
  if (!actors::write_safetensors(options.out, tensors, metadata, &error)) {
    std::fprintf(stderr, "troupe export: %s\n", error.c_str());
    return 1;
  }
  std::printf("wrote %zu tensors (%lld parameters) of the initial weights to %s\n", tensors.size(),
              static_cast<long long>(parameter_count(tensors)), options.out.c_str());
  return 0;
}

}  // namespace

int run_export(const export_options& options) {
  if (options.format != "safetensors") {
    std::fprintf(stderr, "troupe export: unknown format %s (troupe writes safetensors)\n",
                 options.format.c_str());
    return 2;
  }
  if (options.initial) return export_initial(options);
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
