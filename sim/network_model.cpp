#include "sim/network_model.h"

#include <algorithm>
#include <limits>

#include "layers/check.h"

namespace troupe::sim {
namespace {

/// Remaining bytes at or under this fraction of a flow's size are rounding error: the flow is
/// done. Rounding leaves about rate × ulp(now) bytes behind, far under this for any sane time.
constexpr double kRelativeDone = 1e-9;
constexpr double kAbsoluteDone = 1e-6;  // bytes

}  // namespace

network_model::network_model(std::vector<double> bandwidths)
    : nominal_(std::move(bandwidths)),
      factor_(nominal_.size(), 1.0),
      carried_(nominal_.size(), 0.0),
      link_flows_(nominal_.size()),
      link_seen_(nominal_.size(), 0),
      capacity_(nominal_.size(), 0.0),
      unfixed_(nominal_.size(), 0),
      open_position_(nominal_.size(), -1) {
  for (double bandwidth : nominal_) TROUPE_CHECK(bandwidth > 0);
}

uint64_t network_model::start(double now, const std::vector<int>& links, double bytes) {
  TROUPE_CHECK(bytes > 0);
  TROUPE_CHECK(!links.empty());
  for (int link : links) TROUPE_CHECK(link >= 0 && static_cast<size_t>(link) < nominal_.size());
  settle(now);
  int slot;
  if (free_slots_.empty()) {
    slot = static_cast<int>(slots_.size());
    slots_.emplace_back();
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  flow& f = slots_[slot];
  f.id = next_id_++;
  f.links.assign(links.begin(), links.end());  // reuses the slot's capacity
  f.remaining = bytes;
  f.done_below = std::max(kRelativeDone * bytes, kAbsoluteDone);
  for (int link : links) link_flows_[link].push_back(slot);
  changed_links_.push_back(links.front());  // the new flow reaches the rest of its path
  active_.push_back(slot);                  // ids only grow, so active_ stays in id order
  assign_rates();
  return f.id;
}

std::optional<double> network_model::next_finish() const {
  if (active_.empty()) return std::nullopt;
  return next_finish_;
}

std::vector<uint64_t> network_model::advance(double now) {
  settle(now);
  std::vector<uint64_t> finished;
  size_t kept = 0;
  for (int slot : active_) {
    flow& f = slots_[slot];
    // finish_at is the very value next_finish() reported, so advancing to it always finishes
    // the flow, whatever rounding left in `remaining`.
    if (f.finish_at > now && f.remaining > f.done_below) {
      active_[kept++] = slot;
      continue;
    }
    finished.push_back(f.id);
    for (int link : f.links) {
      carried_[link] += f.remaining;  // the rounding residue: totals match the flow's bytes
      remove_from_link(link, slot);
      changed_links_.push_back(link);
    }
    f.remaining = 0;
    free_slots_.push_back(slot);
  }
  active_.resize(kept);
  // Without a finish no rate changes, and each finish_at, being absolute, still holds.
  if (!finished.empty()) assign_rates();
  return finished;
}

void network_model::set_bandwidth_factor(int link, double factor, double now) {
  TROUPE_CHECK(link >= 0 && static_cast<size_t>(link) < nominal_.size());
  TROUPE_CHECK(factor > 0);
  settle(now);
  factor_[link] = factor;
  changed_links_.push_back(link);
  assign_rates();
}

size_t network_model::active_flows() const { return active_.size(); }

double network_model::flow_rate(uint64_t id) const {
  for (int slot : active_) {
    if (slots_[slot].id == id) return slots_[slot].rate;
  }
  return 0;
}

void network_model::settle(double now) {
  TROUPE_CHECK(now >= now_);  // also rejects NaN
  const double elapsed = now - now_;
  now_ = now;
  if (elapsed == 0) return;
  for (int slot : active_) {
    flow& f = slots_[slot];
    // The clamp matters only when a caller overshoots a finish (see advance()).
    const double moved = std::min(f.rate * elapsed, f.remaining);
    f.remaining -= moved;
    for (int link : f.links) carried_[link] += moved;
  }
}

// Max-min rates split over the connected components of the flows-and-links graph: a change
// can move only the rates of the flows it is connected to. So only the component reached
// from changed_links_ is recomputed; every other flow keeps its rate and its finish_at.
void network_model::collect_component() {
  ++visit_stamp_;
  component_links_.clear();
  component_flows_.clear();
  for (int link : changed_links_) visit_link(link);
  changed_links_.clear();
  for (size_t next = 0; next < component_links_.size(); ++next) {
    for (int slot : link_flows_[component_links_[next]]) {
      flow& f = slots_[slot];
      if (f.seen == visit_stamp_) continue;
      f.seen = visit_stamp_;
      component_flows_.push_back(slot);
      for (int crossed : f.links) visit_link(crossed);
    }
  }
}

void network_model::visit_link(int link) {
  if (link_seen_[link] == visit_stamp_) return;
  link_seen_[link] = visit_stamp_;
  component_links_.push_back(link);
}

// Progressive filling over the component. Every link starts with its full bandwidth and all
// its flows unfixed; the link with the smallest share (capacity left / unfixed flows) is the
// bottleneck of its unfixed flows, which get that share and give it up on every link they
// cross; repeat until every flow is fixed. A plain scan for the smallest share beats a heap
// at the sizes met here (a hundred links or so: no unpredictable branches, no stale
// entries); the cost is O(bottlenecks × component links).
void network_model::assign_rates() {
  collect_component();
  open_links_.clear();
  open_shares_.clear();
  for (int link : component_links_) {
    const size_t flows = link_flows_[link].size();
    if (flows == 0) continue;
    capacity_[link] = nominal_[link] * factor_[link];
    unfixed_[link] = static_cast<int>(flows);
    open_position_[link] = static_cast<int>(open_links_.size());
    open_links_.push_back(link);
    open_shares_.push_back(capacity_[link] / unfixed_[link]);
  }
  for (int slot : component_flows_) slots_[slot].fixed = false;
  while (!open_links_.empty()) {
    size_t smallest = 0;
    for (size_t i = 1; i < open_shares_.size(); ++i) {
      if (open_shares_[i] < open_shares_[smallest]) smallest = i;
    }
    fix_flows_of(open_links_[smallest], open_shares_[smallest]);
  }
  for (int slot : component_flows_) {
    flow& f = slots_[slot];
    TROUPE_CHECK(f.fixed && f.rate > 0);
    f.finish_at = now_ + f.remaining / f.rate;
  }
  next_finish_ = std::numeric_limits<double>::infinity();
  for (int slot : active_) next_finish_ = std::min(next_finish_, slots_[slot].finish_at);
}

void network_model::fix_flows_of(int link, double share) {
  for (int slot : link_flows_[link]) {
    flow& f = slots_[slot];
    if (f.fixed) continue;
    f.fixed = true;
    f.rate = share;
    for (int crossed : f.links) give_up(crossed, share);
  }
}

/// Takes a newly fixed flow's `rate` off `link`: the link's share changes, or, with no
/// unfixed flow left, it leaves the open links.
void network_model::give_up(int link, double rate) {
  capacity_[link] -= rate;
  const int position = open_position_[link];
  if (--unfixed_[link] > 0) {
    open_shares_[position] = capacity_[link] / unfixed_[link];
    return;
  }
  open_links_[position] = open_links_.back();
  open_shares_[position] = open_shares_.back();
  open_position_[open_links_[position]] = position;
  open_links_.pop_back();
  open_shares_.pop_back();
}

void network_model::remove_from_link(int link, int slot) {
  std::vector<int>& flows = link_flows_[link];
  auto found = std::find(flows.begin(), flows.end(), slot);
  TROUPE_CHECK(found != flows.end());
  *found = flows.back();
  flows.pop_back();
}

}  // namespace troupe::sim
