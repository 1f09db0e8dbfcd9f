#include "actors/engine/admission.h"

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
  settings.replicas = p.replicas;
  settings.max_active_keys = p.max_active_keys > 0 ? p.max_active_keys : p.stages;
  settings.min_update_interval =
      p.min_update_interval > 0 ? p.min_update_interval : p.micro_batches;
  settings.max_staleness = p.max_staleness;
  const bool async = p.mode == pipeline_mode::async;
  if (async && p.replicas > 1) settings.replica_staleness = p.replica_staleness;
  if (async && p.staleness_correction == staleness_correction_kind::two_bw) {
    settings.max_staleness = settings.max_staleness < 0 ? 1 : std::min(settings.max_staleness, 1);
  }
  settings.micro_batch_size = config.training.batch_size / (int64_t(p.replicas) * p.micro_batches);
  settings.total_steps = total_steps;
  return settings;
}

admission_policy::admission_policy(admission_settings settings)
    : settings_(std::move(settings)),
      total_keys_(settings_.total_steps * settings_.micro_batches),
      admitted_(static_cast<size_t>(std::max(1, settings_.replicas)),
                settings_.first_step * settings_.micro_batches),
      retired_(admitted_) {
  TROUPE_CHECK(settings_.micro_batches >= 1 && settings_.stages >= 1 && settings_.replicas >= 1);
  TROUPE_CHECK(settings_.first_step <= settings_.total_steps);
  if (settings_.mode == pipeline_mode::async) {
    limit_ = std::max(1, settings_.max_active_keys);
    // A backward at any stage sees at most ceil((active - 1) / MUI) newer weight versions, so
    // holding admission to MUI * bound + 1 keys keeps staleness within the bound.
    if (settings_.max_staleness >= 0) {
      limit_ = std::min<int64_t>(
          limit_, int64_t(settings_.max_staleness) * settings_.min_update_interval + 1);
    }
  } else if (settings_.schedule != pipeline_schedule::gpipe) {
    // 1F1B and its descendants (zero-bubble, interleaved): at most a key per stage in flight.
    limit_ = std::min(settings_.stages, settings_.micro_batches);
  } else {
    limit_ = settings_.micro_batches;
  }
}

bool admission_policy::may_admit_next(int replica) const {
  const int64_t admitted = admitted_[replica];
  if (admitted >= total_keys_ || active(replica) >= limit_) return false;
  if (pause_at_key_ >= 0 && admitted >= pause_at_key_) return false;
  if (settings_.mode == pipeline_mode::async) return within_replica_staleness(replica);
  // Sync: the keys of one step at a time; the next step starts after every key of this one
  // has retired in every replica (every stage has stepped by then).
  if (admitted % settings_.micro_batches != 0) return true;
  return std::all_of(retired_.begin(), retired_.end(),
                     [admitted](int64_t retired) { return retired >= admitted; });
}

int64_t admission_policy::slowest_version() const {
  const int64_t interval = std::max(1, settings_.min_update_interval);
  return *std::min_element(retired_.begin(), retired_.end()) / interval;
}

bool admission_policy::within_replica_staleness(int replica) const {
  if (settings_.replicas < 2 || settings_.replica_staleness < 0) return true;
  const int64_t interval = std::max(1, settings_.min_update_interval);
  const int64_t reached = (admitted_[replica] + 1) / interval;
  return reached - slowest_version() <= settings_.replica_staleness;
}

admission admission_policy::make_admission(int replica, int64_t local) const {
  const int64_t micro = settings_.micro_batches;
  admission result;
  result.step = local / micro;
  result.micro_batch = static_cast<int>(local % micro);
  result.replica = replica;
  const int64_t within_step = int64_t(replica) * micro + result.micro_batch;
  result.key = static_cast<uint64_t>(result.step * micro * settings_.replicas + within_step);
  result.sample_offset = within_step * settings_.micro_batch_size;
  if (settings_.replicas > 1) result.replica_floor = slowest_version();
  return result;
}

std::vector<admission> admission_policy::admit() {
  std::vector<admission> result;
  // A key of each replica in turn, so that every pipeline fills at once.
  for (bool any = true; any;) {
    any = false;
    for (int r = 0; r < settings_.replicas; ++r) {
      if (!may_admit_next(r)) continue;
      admission entry = make_admission(r, admitted_[r]++);
      active_keys_.insert(entry.key);
      result.push_back(entry);
      any = true;
    }
  }
  return result;
}

int64_t admission_policy::pause_at_step_boundary() {
  const int64_t micro = settings_.micro_batches;
  const int64_t furthest = *std::max_element(admitted_.begin(), admitted_.end());
  pause_at_key_ = std::min(total_keys_, (furthest + micro - 1) / micro * micro);
  return pause_at_key_ / micro;
}

bool admission_policy::quiet() const {
  if (pause_at_key_ < 0 || active() != 0) return false;
  return std::all_of(admitted_.begin(), admitted_.end(),
                     [this](int64_t admitted) { return admitted == pause_at_key_; });
}

bool admission_policy::finished() const {
  return std::all_of(retired_.begin(), retired_.end(),
                     [this](int64_t retired) { return retired == total_keys_; });
}

int64_t admission_policy::retired_count() const {
  int64_t total = 0;
  for (int64_t retired : retired_) total += retired;
  return total;
}

bool admission_policy::retired(uint64_t key) {
  if (active_keys_.erase(key) == 0) return false;
  const uint64_t per_step = static_cast<uint64_t>(settings_.micro_batches) * settings_.replicas;
  ++retired_[(key % per_step) / static_cast<uint64_t>(settings_.micro_batches)];
  return true;
}

}  // namespace troupe::actors
