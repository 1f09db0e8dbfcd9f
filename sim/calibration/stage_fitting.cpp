#include "sim/calibration/stage_fitting.h"

namespace troupe::sim {
namespace {

/// Multiplies `field` of the blocks in `range` so that they add up to `total` (when they add up
/// to anything at all).
void scale_to(std::vector<block_profile>& blocks, actors::stage_range range, double total,
              double block_profile::*field) {
  double sum = 0;
  for (size_t i = range.first; i < range.last; ++i) sum += blocks[i].*field;
  if (sum <= 0 || total <= 0) return;
  for (size_t i = range.first; i < range.last; ++i) blocks[i].*field *= total / sum;
}

}  // namespace

void fit_blocks_to_stages(const actors::job_config& config,
                          const std::vector<stage_timing>& timings,
                          std::vector<block_profile>* blocks) {
  const size_t skipped = actors::blocks_without_input_gradient(config);
  for (size_t s = 0; s < timings.size(); ++s) {
    const stage_timing& stage = timings[s];
    const actors::stage_range range = stage.range;
    scale_to(*blocks, range, stage.forward_s, &block_profile::forward_s);
    double alone = 0;
    for (size_t i = range.first; i < range.last; ++i) {
      const block_profile& block = (*blocks)[i];
      alone += s > 0 || i >= skipped ? block.backward_s : block.backward_first_s;
    }
    if (alone > 0 && stage.backward_s > 0) {
      for (size_t i = range.first; i < range.last; ++i) {
        (*blocks)[i].backward_s *= stage.backward_s / alone;
        (*blocks)[i].backward_first_s *= stage.backward_s / alone;
      }
    }
    scale_to(*blocks, range, stage.step_s, &block_profile::step_s);
    scale_to(*blocks, range, stage.stash_s, &block_profile::stash_s);
    scale_to(*blocks, range, stage.predict_s, &block_profile::predict_s);
  }
}

}  // namespace troupe::sim
