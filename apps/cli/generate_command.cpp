// `troupe generate CHECKPOINT --prompt TEXT`: continues a prompt with a trained byte-level
// language model, one token at a time, sampling from softmax(logits / temperature) with a
// seeded generator (the largest logit at temperature 0).

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "actors/engine/partition.h"
#include "actors/engine/stage_device.h"
#include "actors/storage/model_weights.h"
#include "actors/storage/safetensors.h"
#include "apps/cli/commands.h"
#include "apps/cli/model_files.h"
#include "layers/backend_registry.h"
#include "layers/random.h"

namespace troupe::apps {
namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "troupe generate: %s\n", message.c_str());
  return 2;
}

/// The next token: a draw from softmax(logits / temperature), or the first largest logit.
int sample(const float* logits, int vocab, double temperature, layers::random_generator& random) {
  int best = 0;
  for (int v = 1; v < vocab; ++v) {
    if (logits[v] > logits[best]) best = v;
  }
  if (temperature <= 0) return best;
  std::vector<double> weights(static_cast<size_t>(vocab));
  double total = 0;
  for (int v = 0; v < vocab; ++v) {
    weights[v] = std::exp((logits[v] - logits[best]) / temperature);
    total += weights[v];
  }
  double draw = static_cast<double>(random.uniform()) * total;
  for (int v = 0; v < vocab; ++v) {
    draw -= weights[v];
    if (draw < 0) return v;
  }
  return best;
}

}  // namespace

int run_generate(const generate_options& options) {
  std::string error;
  auto config = job_of_weights(options.weights, options.job_file, &error);
  if (!config) return fail(error);
  if (config->data.dataset != actors::dataset_kind::text || config->model.input_shape.size() != 1) {
    return fail("the job of " + options.weights + " is not a language model (data.dataset = \"" +
                to_string(config->data.dataset) + "\")");
  }
  auto tensors = read_weights(options.weights, &error);
  if (!tensors) return fail(error);
  // One stage holding the whole model, whatever the run was cut into.
  config->parallelism.stages = 1;
  config->parallelism.partition = "uniform";
  config->parallelism.devices = {"cpu"};
  config->model.init_from.clear();
  auto states = actors::stage_states_from_tensors(*tensors, *config, &error);
  if (!states) return fail(options.weights + ": " + error);
  auto device = layers::create_backend("cpu", 0, &error);
  if (!device) return fail(error);
  auto model = actors::make_layers_stage_device(
      *config, actors::stage_range{0, config->model.layers.size()}, *device);
  if (!model->load_state(states->front(), true, &error))
    return fail(options.weights + ": " + error);

  const auto context = static_cast<int>(config->model.input_shape[0]);
  std::vector<int> tokens;
  for (unsigned char c : options.prompt) tokens.push_back(c);
  if (tokens.empty()) tokens.push_back('\n');
  std::fwrite(options.prompt.data(), 1, options.prompt.size(), stdout);
  layers::random_generator random(options.seed);
  std::vector<float> window(static_cast<size_t>(context), 0.0f);
  for (int64_t n = 0; n < options.tokens; ++n) {
    // The last `context` tokens from position 0; later positions hold zeros, which a causal
    // model's prediction at the last real token never sees.
    const int used = std::min<int>(context, static_cast<int>(tokens.size()));
    const size_t first = tokens.size() - static_cast<size_t>(used);
    for (int t = 0; t < context; ++t) {
      window[t] = t < used ? static_cast<float>(tokens[first + t]) : 0.0f;
    }
    actors::key_message key;
    key.kind = actors::key_kind::evaluate;
    key.payload =
        layers::tensor::from_host(*device, device->default_stream(), {1, context}, window);
    const std::vector<float> logits = model->forward(key, false).to_host(device->default_stream());
    const int vocab = static_cast<int>(logits.size() / context);
    const int next =
        sample(logits.data() + int64_t(used - 1) * vocab, vocab, options.temperature, random);
    tokens.push_back(next);
    std::fputc(next, stdout);
    std::fflush(stdout);
  }
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace troupe::apps
