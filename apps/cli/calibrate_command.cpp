// `troupe calibrate JOB --out PROFILE`: times the job's blocks and the ipc:// transport on this
// machine, for `troupe simulate --profile`.

#include <cstdio>
#include <string>

#include "actors/config/job_file.h"
#include "actors/storage/file_system.h"
#include "apps/cli/commands.h"
#include "sim/calibration/calibrate.h"
#include "sim/profile.h"

namespace troupe::apps {
namespace {

int bad_input(const std::string& message) {
  std::fprintf(stderr, "troupe calibrate: %s\n", message.c_str());
  return 2;
}

void print_blocks(const sim::machine_profile& profile) {
  std::printf("%-6s %-10s %12s %12s %12s %12s\n", "block", "type", "forward ms", "backward ms",
              "first bw ms", "step ms");
  for (size_t b = 0; b < profile.blocks.size(); ++b) {
    const sim::block_profile& block = profile.blocks[b];
    std::printf("%-6zu %-10s %12.4f %12.4f %12.4f %12.4f\n", b, block.type.c_str(),
                1e3 * block.forward_s, 1e3 * block.backward_s, 1e3 * block.backward_first_s,
                1e3 * block.step_s);
  }
  std::printf("loss %.4f ms; %lld samples per key, %d thread(s) per stage on %s\n",
              1e3 * profile.loss_s, static_cast<long long>(profile.batch), profile.threads,
              profile.backend.c_str());
}

/// A graph's nodes: one visit at each row count timed (what the simulator interpolates).
void print_nodes(const sim::machine_profile& profile) {
  std::printf("%-10s %8s %12s %12s %12s %12s\n", "node", "rows", "forward ms", "backward ms",
              "first bw ms", "step ms");
  for (const sim::node_profile& node : profile.nodes) {
    for (size_t i = 0; i < node.rows.size(); ++i) {
      std::printf("%-10s %8lld %12.4f %12.4f %12.4f", i == 0 ? node.name.c_str() : "",
                  static_cast<long long>(node.rows[i]), 1e3 * node.forward_s[i],
                  1e3 * node.backward_s[i], 1e3 * node.backward_first_s[i]);
      if (i == 0) std::printf(" %12.4f", 1e3 * node.step_s);
      std::printf("\n");
    }
  }
  std::printf(
      "per visit; loss %.4f ms over %lld rows; %lld instances per key, %d thread(s) per "
      "stage on %s\n",
      1e3 * profile.loss_s, static_cast<long long>(profile.loss_rows),
      static_cast<long long>(profile.batch), profile.threads, profile.backend.c_str());
}

}  // namespace

int run_calibrate(const calibrate_options& options) {
  actors::job_error problem;
  auto config = actors::load_job_file(options.job_file, options.overrides, &problem);
  if (!config) return bad_input(problem.message);
  std::string error;
  auto profile = sim::calibrate(*config, options.seconds, &error);
  if (!profile) {
    std::fprintf(stderr, "troupe calibrate: %s: %s\n", options.job_file.c_str(), error.c_str());
    return 1;
  }
  if (profile->nodes.empty()) {
    print_blocks(*profile);
  } else {
    print_nodes(*profile);
  }
  std::printf("ipc:// message: latency %.1f us, bandwidth %.2f GB/s\n",
              1e6 * profile->link_latency_s, profile->link_bandwidth / 1e9);
  std::printf("CPU per message end: %.1f us between threads, %.1f us between processes\n",
              1e6 * profile->inproc_message_cpu_s, 1e6 * profile->ipc_message_cpu_s);
  std::printf("inproc:// message between threads: latency %.1f us\n",
              1e6 * profile->inproc_latency_s);
  if (!actors::posix_files().write_atomically(options.out_file, sim::to_json_text(*profile),
                                              &error))
    return bad_input(error);
  return 0;
}

}  // namespace troupe::apps
