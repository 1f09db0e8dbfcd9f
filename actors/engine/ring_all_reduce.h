#pragma once

// One rank's part of a ring all-reduce among the same stage of R replicas, as a state machine:
// a reduce-scatter and then an all-gather over a ring of ranks (rank r sends to r + 1 and
// hears from r − 1). The buffer is cut into R chunks; at ring step t (0 ≤ t < 2(R − 1)) rank r
// sends chunk (r − t) mod R and receives chunk (r − t − 1) mod R, adding it during the first
// R − 1 steps and taking it as it is during the last R − 1. Each rank sends 2(R − 1)/R of the
// buffer, the least any all-reduce can, and every rank ends with the same bits. No sockets and
// no clocks: the stage logic runs it and the hosts carry its chunks (real runs over ZeroMQ, the
// simulator over its network model).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace troupe::actors {

/// One chunk on its way from a rank to the next.
struct ring_chunk {
  int64_t round = 0;  ///< which all-reduce of the rank's life (0, 1, ...)
  int step = 0;       ///< ring step, 0 ≤ step < 2(ranks − 1)
  std::shared_ptr<const std::vector<float>> values;
};

class ring_all_reduce {
 public:
  /// Rank `rank` of `ranks`, reducing buffers of `length` floats.
  ring_all_reduce(int rank, int ranks, int64_t length);

  /// Starts the next round with this rank's contribution (`length` values); returns the chunk
  /// to send. With one rank the round is finished at once.
  std::vector<ring_chunk> start(std::vector<float> values);
  /// A chunk from the previous rank; what to send on goes to `to_send`. A chunk of another
  /// round or step than the ring can produce, or of the wrong size, changes nothing: false,
  /// with `error` saying why.
  bool receive(const ring_chunk& chunk, std::vector<ring_chunk>* to_send, std::string* error);

  /// The current round has started and not finished.
  bool under_way() const { return started_ && !finished_; }
  /// The current round is finished: take_result() holds the sum.
  bool finished() const { return finished_; }
  /// The sum of every rank's contribution; the next round may start after this.
  std::vector<float> take_result();
  /// Rounds finished so far.
  int64_t rounds() const { return round_; }

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  static int steps(int ranks) { return 2 * (ranks - 1); }
  /// The bytes one rank sends in one round.
  int64_t bytes_sent_per_round() const;

 private:
  /// [first, last) of chunk `chunk`.
  std::pair<int64_t, int64_t> chunk_range(int chunk) const;
  int chunk_received_at(int step) const;
  ring_chunk chunk_to_send(int step) const;
  /// Takes step `step`'s chunk into the buffer and sends the next.
  void take(int step, const std::vector<float>& values, std::vector<ring_chunk>* to_send);

  int rank_;
  int ranks_;
  int64_t length_;
  int64_t round_ = 0;
  bool started_ = false;
  bool finished_ = false;
  int next_step_ = 0;  ///< the step whose chunk comes next
  std::vector<float> buffer_;
  /// Chunks of this round that came before start(), by step (a faster neighbour).
  std::map<int, std::shared_ptr<const std::vector<float>>> early_;
};

}  // namespace troupe::actors
