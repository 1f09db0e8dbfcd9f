#pragma once

// Flows over shared links in virtual time. Every flow crosses a fixed path of links; at any
// moment the links' bandwidth is shared max-min fairly among the flows crossing them
// (progressive filling: the most constrained link fixes the rate of its flows, which are then
// removed, and so on). Rates change only when a flow starts or finishes, or a link's
// bandwidth changes; between those moments every flow advances linearly. Latency is the
// caller's to add (see cluster_model::path_latency_s): this model only carries bytes.
//
// Times are virtual seconds and never go backwards: a call with a time earlier than the last
// call's is a bug in the caller and aborts (TROUPE_CHECK), as do invalid links and
// non-positive bytes, bandwidths or factors. Progress is settled only at calls, at the rates
// of the moment, so a caller advance()s to every next_finish() before acting at a later time.
// Results depend only on the calls made: no randomness, no clock, no unordered iteration.
// Not thread-safe; one owner calls it.
//
// Cost: start(), advance() and set_bandwidth_factor() recompute the rates of the flows
// connected (through shared links) to the change, O(bottlenecks × links) of that component;
// next_finish() is cached. Nothing is allocated once the model has warmed up, except
// advance()'s result when a flow finishes.

#include <cstdint>
#include <optional>
#include <vector>

namespace troupe::sim {

class network_model {
 public:
  /// One entry per link, bytes/s (all > 0).
  explicit network_model(std::vector<double> bandwidths);

  /// Starts a flow of `bytes` (> 0) over `links` (non-empty, valid indices) at virtual time
  /// `now` (never earlier than the last call's time). Returns the flow's id (1, 2, 3, ...).
  uint64_t start(double now, const std::vector<int>& links, double bytes);
  /// The virtual time at which the next flow finishes at the current rates; nothing when no
  /// flow is active. Cached: costs nothing.
  std::optional<double> next_finish() const;
  /// Advances to `now` (no later than next_finish() when one is pending) and returns the ids
  /// of the flows finished by then, in id order; rates are recomputed for the rest. A flow
  /// counts as finished once its finish time is reached or its remaining bytes are a rounding
  /// error, so advancing to next_finish() always finishes at least one flow. Advancing past
  /// next_finish() finishes the overdue flows at `now` and runs the others at their old
  /// rates: an approximation the caller avoids by stopping at every finish.
  std::vector<uint64_t> advance(double now);
  /// Multiplies link `link`'s nominal bandwidth by `factor` (> 0) from `now` on (link
  /// degradation; 1 restores it).
  void set_bandwidth_factor(int link, double factor, double now);

  size_t active_flows() const;
  /// The current rate of active flow `id` in bytes/s, or 0 when it is not active (for tests
  /// and traces; linear in the number of active flows).
  double flow_rate(uint64_t id) const;
  /// Bytes each link has carried so far (for link utilisation: carried / (bandwidth × time)).
  const std::vector<double>& carried_bytes() const { return carried_; }
  const std::vector<double>& bandwidths() const { return nominal_; }

 private:
  struct flow {
    uint64_t id = 0;
    std::vector<int> links;
    double remaining = 0;   ///< bytes
    double rate = 0;        ///< bytes/s
    double finish_at = 0;   ///< virtual s, at `rate`
    double done_below = 0;  ///< bytes: remaining at or under this is a rounding error
    bool fixed = false;     ///< assign_rates' scratch
    uint64_t seen = 0;      ///< collect_component's mark
  };
  void settle(double now);
  void collect_component();
  void assign_rates();
  void fix_flows_of(int link, double share);
  void give_up(int link, double rate);
  void visit_link(int link);
  void remove_from_link(int link, int slot);

  std::vector<double> nominal_;
  std::vector<double> factor_;
  std::vector<double> carried_;
  /// Flow storage. Slots are reused, so that a slot's path keeps its capacity and starting a
  /// flow allocates nothing once the model has warmed up.
  std::vector<flow> slots_;
  std::vector<int> free_slots_;
  std::vector<int> active_;                   ///< slots of the active flows, in id order
  std::vector<std::vector<int>> link_flows_;  ///< per link, the slots of the flows crossing it
  /// Links whose flows or bandwidth changed since rates were last assigned.
  std::vector<int> changed_links_;
  // assign_rates' scratch, kept between calls so that the hot path does not allocate.
  std::vector<int> component_links_;  ///< links reachable from changed_links_ through flows
  std::vector<int> component_flows_;  ///< slots of the flows on component_links_
  std::vector<uint64_t> link_seen_;   ///< per link, collect_component's mark
  uint64_t visit_stamp_ = 0;
  std::vector<double> capacity_;  ///< per link, bandwidth not yet given to a fixed flow
  std::vector<int> unfixed_;      ///< per link, flows on it whose rate is not fixed yet
  /// The component's links that still have unfixed flows, and their shares (capacity_ /
  /// unfixed_), side by side so that finding the smallest share is a tight scan.
  std::vector<int> open_links_;
  std::vector<double> open_shares_;
  std::vector<int> open_position_;  ///< per link, its index in open_links_
  double now_ = 0;
  double next_finish_ = 0;  ///< meaningful only while a flow is active
  uint64_t next_id_ = 1;
};

}  // namespace troupe::sim
