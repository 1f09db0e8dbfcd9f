#pragma once

// Jobs and clusters that several simulator tests share: an ideal cluster on which equal
// blocks take equal time and messages none, a model of equal linear blocks, and small dynamic
// models (graphs).

#include <gtest/gtest.h>

#include <string>

#include "actors/config/job_data.h"
#include "actors/config/job_file.h"
#include "actors/engine/run_reports.h"
#include "sim/simulation.h"

namespace troupe::sim {

/// How a cluster's devices take their stages' work (device_model::pooled, time_sliced).
enum class sharing { none, pooled, time_sliced };

/// Devices as fast as their FLOPs allow, with free memory traffic and links: every stage of a
/// model of equal linear blocks then takes the same time, and messages take none. `shared`
/// makes the devices one pool; `more` is appended to the file (a [placement], say).
inline cluster_model ideal_cluster(int devices, sharing shared = sharing::none,
                                   const std::string& more = "") {
  const std::string text = R"(
[device_types.ideal]
pooled = )" + std::string(shared == sharing::none ? "false" : "true") +
                           "\ntime_sliced = " +
                           std::string(shared == sharing::time_sliced ? "true" : "false") + R"(
peak_flops = 1e12
memory_bandwidth = 1e18
memory_bytes = 1e12
[[nodes]]
name = "node"
device_type = "ideal"
devices = )" + std::to_string(devices) +
                           R"(
device_link = { bandwidth = 1e18 }
nic = { bandwidth = 1e18 }
)" + more;
  std::string error;
  auto cluster = parse_cluster(text, "ideal", &error);
  EXPECT_TRUE(cluster) << error;
  return *cluster;
}

/// S linear 256 -> 256 blocks on synthetic samples of [1, 256] in 256 classes, behind a
/// layernorm: its
/// parameters make stage 0's first linear block compute its input gradient too (a model's
/// leading parameterless blocks would not), so all stages do the same work, and it costs about
/// 1% of a linear block.
inline actors::job_config balanced_job(int stages, int micro_batches, actors::pipeline_mode mode) {
  std::string layers = "{ type = \"layernorm\" }";
  for (int s = 0; s < stages; ++s) layers += ", { type = \"linear\", out = 256 }";
  const int batch = 32 * micro_batches;
  const std::string text =
      "[model]\ninput_shape = [1, 256]\nlayers = [" + layers +
      "]\n[data]\ndataset = \"synthetic\"\nclasses = 256\nsynthetic_train = " +
      std::to_string(50 * batch) +
      "\nsynthetic_test = 16\n[parallelism]\nstages = " + std::to_string(stages) + "\nmode = \"" +
      to_string(mode) +
      "\"\nschedule = \"gpipe\"\nmicro_batches = " + std::to_string(micro_batches) +
      "\n[training]\nbatch_size = " + std::to_string(batch) + "\nepochs = 1\nlr = 0.01\n";
  actors::job_error problem;
  auto config = actors::parse_job(text, "balanced job", {}, &problem);
  EXPECT_TRUE(config) << problem.message;
  return *config;
}

/// A small sync job of 3 stages whose numerics the simulator can run for real (momentum, so the
/// optimizer has state).
inline actors::job_config numerics_job() {
  actors::job_config config = balanced_job(3, 2, actors::pipeline_mode::sync);
  config.model.layers.back().out = 8;
  config.data.classes = 8;
  config.data.synthetic_train = 640;
  config.training.batch_size = 32;
  config.training.epochs = 2;
  config.training.momentum = 0.9;
  config.parallelism.threads = 3;
  return config;
}

/// embed → cell → head: an LSTM looped over each sequence (every position predicts the next
/// token), or a Tree-LSTM joined up each ListOps tree (the root's state classifies it).
inline actors::job_config graph_job(bool trees, int stages, const std::string& mode,
                                    int micro_batches = 1) {
  const std::string cell = trees ? "{ type = \"tree_lstm_cell\", out = 8, arity = 2 }"
                                 : "{ type = \"lstm_cell\", out = 8 }";
  const std::string text =
      "[[model.nodes]]\nname = \"embed\"\nlayers = [{ type = \"embedding\", vocab = 16, dim = 6 "
      "}]\nnext = \"cell\"\n[[model.nodes]]\nname = \"cell\"\nlayers = [" +
      cell + "]\nroute = \"" + (trees ? "tree" : "loop") + "\"\nemit = \"" +
      (trees ? "root" : "every") +
      "\"\nnext = \"head\"\n[[model.nodes]]\nname = \"head\"\nlayers = [{ type = \"linear\", "
      "out = " +
      (trees ? "10" : "16") + " }]\n[data]\ndataset = \"" + (trees ? "listops" : "text-records") +
      "\"\npath = \"unused\"\nmax_depth = 3\ncontext = 64\nsynthetic_train = 96\nsynthetic_test = "
      "16\n[parallelism]\nstages = " +
      std::to_string(stages) + "\nmode = \"" + mode +
      "\"\npartition = \"uniform\"\nmicro_batches = " + std::to_string(micro_batches) +
      "\n[training]\nbatch_size = 8\nepochs = 1\nmax_steps = 6\nlr = 0.05\noptimizer = "
      "\"adam\"\nseed = 3\n[metrics]\nlog_interval = 1\n";
  actors::job_error problem;
  auto config = actors::parse_job(text, "graph job", {}, &problem);
  EXPECT_TRUE(config) << problem.message;
  return *config;
}

inline simulation_result simulated(const actors::job_config& config, const actors::job_data& data,
                                   const cluster_model& cluster,
                                   const simulation_options& options = {}) {
  std::string error;
  actors::quiet_observer observer;
  auto result = simulate(config, data, cluster, options, observer, &error);
  EXPECT_TRUE(result) << error;
  return std::move(*result);
}

inline simulation_result simulated(const actors::job_config& config, const cluster_model& cluster,
                                   const simulation_options& options = {}) {
  std::string error;
  auto data = actors::load_job_data(config, &error);
  EXPECT_TRUE(data) << error;
  return simulated(config, *data, cluster, options);
}

}  // namespace troupe::sim
