#include "actors/engine/coordinator_logic.h"

#include <algorithm>

#include "layers/check.h"

namespace troupe::actors {

admission_settings admission_settings::of(const job_config& config, int64_t total_steps) {
  const parallelism_config& p = config.parallelism;
  admission_settings settings;
  settings.mode = p.mode;
  settings.schedule = p.schedule;
  settings.stages = p.stages;
  settings.micro_batches = p.micro_batches;
  settings.max_active_keys = p.max_active_keys > 0 ? p.max_active_keys : p.stages;
  settings.min_update_interval =
      p.min_update_interval > 0 ? p.min_update_interval : p.micro_batches;
  settings.max_staleness = p.max_staleness;
  if (p.mode == "async" && p.staleness_correction == "2bw") {
    settings.max_staleness = settings.max_staleness < 0 ? 1 : std::min(settings.max_staleness, 1);
  }
  settings.micro_batch_size = config.training.batch_size / p.micro_batches;
  settings.total_steps = total_steps;
  return settings;
}

coordinator_logic::coordinator_logic(admission_settings settings)
    : settings_(std::move(settings)),
      total_keys_(settings_.total_steps * settings_.micro_batches),
      admitted_(settings_.first_step * settings_.micro_batches),
      retired_(admitted_) {
  TROUPE_CHECK(settings_.micro_batches >= 1 && settings_.stages >= 1);
  TROUPE_CHECK(settings_.first_step <= settings_.total_steps);
  if (settings_.mode == "async") {
    limit_ = std::max(1, settings_.max_active_keys);
    // A backward at any stage sees at most ceil((active - 1) / MUI) newer weight versions, so
    // holding admission to MUI * bound + 1 keys keeps staleness within the bound.
    if (settings_.max_staleness >= 0) {
      limit_ = std::min<int64_t>(
          limit_, int64_t(settings_.max_staleness) * settings_.min_update_interval + 1);
    }
  } else if (settings_.schedule != "gpipe") {
    // 1F1B and its descendants (zero-bubble, interleaved): at most a key per stage in flight.
    limit_ = std::min(settings_.stages, settings_.micro_batches);
  } else {
    limit_ = settings_.micro_batches;
  }
}

bool coordinator_logic::may_admit_next() const {
  if (admitted_ >= total_keys_ || active() >= limit_) return false;
  if (pause_at_key_ >= 0 && admitted_ >= pause_at_key_) return false;
  if (settings_.mode == "async") return true;
  // Sync: the keys of one step at a time; the next step starts after every key of this one
  // has retired (every stage has stepped by then).
  const bool starts_step = admitted_ % settings_.micro_batches == 0;
  return !starts_step || active() == 0;
}

admission coordinator_logic::make_admission(uint64_t key) const {
  admission result;
  result.key = key;
  result.step = static_cast<int64_t>(key / settings_.micro_batches);
  result.micro_batch = static_cast<int>(key % settings_.micro_batches);
  result.sample_offset = result.micro_batch * settings_.micro_batch_size;
  return result;
}

std::vector<admission> coordinator_logic::admit() {
  std::vector<admission> result;
  while (may_admit_next()) {
    const uint64_t key = static_cast<uint64_t>(admitted_++);
    active_keys_.insert(key);
    result.push_back(make_admission(key));
  }
  return result;
}

int64_t coordinator_logic::pause_at_step_boundary() {
  const int64_t micro = settings_.micro_batches;
  pause_at_key_ = std::min(total_keys_, (admitted_ + micro - 1) / micro * micro);
  return pause_at_key_ / micro;
}

bool coordinator_logic::retired(uint64_t key) {
  if (active_keys_.erase(key) == 0) return false;
  ++retired_;
  return true;
}

}  // namespace troupe::actors
