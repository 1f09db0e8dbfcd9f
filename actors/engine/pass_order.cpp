#include "actors/engine/pass_order.h"

#include <algorithm>

#include "actors/engine/stage_settings.h"
#include "layers/check.h"

namespace troupe::actors {

std::vector<scheduled_pass> zero_bubble_order(int stages, int index, int micro_batches) {
  TROUPE_CHECK(stages >= 1 && index >= 0 && index < stages && micro_batches >= 1);
  using kind = scheduled_pass::kind;
  const int p = stages, m = micro_batches;
  std::vector<scheduled_pass> order;
  order.reserve(3 * m);
  int f = 0, b = 0, w = 0;  // passes placed so far, of each kind
  while (f < std::min(p - index, m)) order.push_back({kind::forward, f++, index});
  while (b < m || w < m) {
    if (b < f) order.push_back({kind::input_gradient, b++, index});
    if ((f - w >= p || f == m) && w < b) order.push_back({kind::weight_gradients, w++, index});
    if (f < m && f - w < p) {
      order.push_back({kind::forward, f++, index});
    } else if (f == m && b == m) {
      while (w < m) order.push_back({kind::weight_gradients, w++, index});
    }
  }
  return order;
}

std::vector<scheduled_pass> interleaved_order(int workers, int chunks, int worker,
                                              int micro_batches) {
  const int p = workers, v = chunks, m = micro_batches;
  TROUPE_CHECK(p >= 1 && v >= 1 && worker >= 0 && worker < p && m >= p && m % p == 0);
  const int passes = m * v;  // of each direction
  const int warm_up = std::min((p - worker - 1) * 2 + (v - 1) * p, passes);
  std::vector<int> forwards(v, 0), backwards(v, 0);  // per chunk, so far
  std::vector<scheduled_pass> order;
  order.reserve(2 * passes);
  // The k-th pass of a direction visits chunk (k mod p·v) / p: p micro-batches per chunk in
  // turn, the chunks in model order forward and in reverse backward.
  const auto forward = [&](int k) {
    const int chunk = (k % (p * v)) / p;
    order.push_back({scheduled_pass::kind::forward, forwards[chunk]++, chunk * p + worker});
  };
  const auto backward = [&](int k) {
    const int chunk = v - 1 - (k % (p * v)) / p;
    order.push_back({scheduled_pass::kind::backward, backwards[chunk]++, chunk * p + worker});
  };
  for (int k = 0; k < warm_up; ++k) forward(k);
  for (int k = 0; k < passes - warm_up; ++k) {
    forward(warm_up + k);
    backward(k);
  }
  for (int k = passes - warm_up; k < passes; ++k) backward(k);
  return order;
}

pass_turn::pass_turn(std::vector<scheduled_pass> passes)
    : order(std::move(passes)),
      splits_backward(std::any_of(order.begin(), order.end(), [](const scheduled_pass& pass) {
        return pass.what == scheduled_pass::kind::weight_gradients;
      })) {
  TROUPE_CHECK(!order.empty());
}

void pass_turn::advance() {
  const size_t after = next.load(std::memory_order_relaxed) + 1;
  next.store(after == order.size() ? 0 : after, std::memory_order_release);
}

std::vector<std::shared_ptr<pass_turn>> make_pass_turns(const job_config& config) {
  const parallelism_config& p = config.parallelism;
  std::vector<std::shared_ptr<pass_turn>> turns;
  if (p.mode != pipeline_mode::sync) return turns;
  if (p.schedule == pipeline_schedule::zb_h1) {
    for (int stage = 0; stage < p.stages; ++stage) {
      turns.push_back(
          std::make_shared<pass_turn>(zero_bubble_order(p.stages, stage, p.micro_batches)));
    }
  } else if (p.schedule == pipeline_schedule::interleaved) {
    const int workers = pipeline_workers(config);
    if (p.micro_batches % workers != 0) return turns;
    for (int worker = 0; worker < workers; ++worker) {
      turns.push_back(std::make_shared<pass_turn>(
          interleaved_order(workers, p.virtual_stages, worker, p.micro_batches)));
    }
  }
  return turns;
}

int pipeline_worker_of(const job_config& config, int stage) {
  return stage % pipeline_workers(config);
}

int process_of_stage(const job_config& config, int actor, int processes) {
  const int64_t per_replica = pipeline_workers(config);
  const int64_t workers = per_replica * config.parallelism.replicas;
  if (processes > workers)
    return static_cast<int>(actor * int64_t{processes} / stage_actor_count(config));
  const int64_t worker = replica_of_actor(config, actor) * per_replica +
                         pipeline_worker_of(config, stage_of_actor(config, actor));
  return static_cast<int>(worker * processes / workers);
}

void keep_local_turns(const job_config& config, const std::vector<int>& local_actors, int replica,
                      std::vector<std::shared_ptr<pass_turn>>* turns) {
  const int stages = config.parallelism.stages;
  for (int stage = 0; stage < stages; ++stage) {
    const bool local = std::find(local_actors.begin(), local_actors.end(),
                                 replica * stages + stage) != local_actors.end();
    const size_t worker = static_cast<size_t>(pipeline_worker_of(config, stage));
    if (!local && worker < turns->size()) (*turns)[worker] = nullptr;
  }
}

}  // namespace troupe::actors
