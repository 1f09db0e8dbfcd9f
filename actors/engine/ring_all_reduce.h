#pragma once

// One rank's part of a ring all-reduce among the same stage of R replicas, as a state machine:
// a reduce-scatter and then an all-gather over a ring of ranks (rank r sends to r + 1 and
// hears from r − 1). The buffer is cut into R chunks; at ring step t (0 ≤ t < 2(R − 1)) rank r
// sends chunk (r − t) mod R and receives chunk (r − t − 1) mod R, adding it during the first
// R − 1 steps and taking it as it is during the last R − 1. Each rank sends 2(R − 1)/R of the
// buffer, the least any all-reduce can, and every rank ends with the same bits. Chunks larger
// than a piece travel as several pieces, each going round the ring on its own as soon as it
// arrives, so that large buffers stream through the ring (and through memory that the
// allocator keeps mapped) instead of moving a whole chunk per step. No sockets and no clocks:
// the stage logic runs it and the hosts carry its chunks (real runs over ZeroMQ, the simulator
// over its network model).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace troupe::actors {

/// Floats in memory that `owner` keeps alive: a slice of a rank's buffer on its way out, or a
/// received frame. Copies are shallow.
struct float_view {
  std::shared_ptr<const void> owner;
  const float* data = nullptr;
  int64_t count = 0;

  /// A view of all of `values`, which it keeps alive.
  static float_view of(std::shared_ptr<const std::vector<float>> values);
  std::vector<float> to_vector() const { return std::vector<float>(data, data + count); }
};

/// One chunk on its way from a rank to the next.
struct ring_chunk {
  int64_t round = 0;  ///< which all-reduce of the rank's life (0, 1, ...)
  int step = 0;       ///< ring step, 0 ≤ step < 2(ranks − 1)
  int piece = 0;      ///< which piece of its chunk, 0 ≤ piece < pieces()
  /// The chunk's values. A chunk a rank sends views its buffer, which must not change until
  /// the receiver has taken the values: the ring makes it so (a rank writes that part of its
  /// buffer again only after the chunk went round the ring), and a buffer some sent chunk
  /// still holds is not reused for the next round.
  float_view values;
};

/// The most floats of a chunk that travel as one message: a longer chunk goes in pieces.
constexpr int64_t ring_piece_floats = int64_t{1} << 20;

class ring_all_reduce {
 public:
  /// Rank `rank` of `ranks`, reducing buffers of `length` floats; a chunk travels in pieces
  /// of at most `piece_floats` floats. With `sizes_only` every round carries sizes only: its
  /// chunks view no memory, start() takes no values and the result is empty (the simulator's
  /// timing-only mode).
  ring_all_reduce(int rank, int ranks, int64_t length, int64_t piece_floats = ring_piece_floats,
                  bool sizes_only = false);

  /// Starts the next round with this rank's contribution (`length` values, copied); returns
  /// the chunk to send. With one rank the round is finished at once.
  std::vector<ring_chunk> start(const std::vector<float>& values);
  /// A chunk from the previous rank; what to send on goes to `to_send`. Chunks may come in any
  /// order (a piece's later step, the next round's first steps): those that cannot be taken
  /// yet wait. A chunk of a round, step or piece the ring cannot produce now, a second copy,
  /// or one of the wrong size changes nothing: false, with `error` saying why.
  bool receive(const ring_chunk& chunk, std::vector<ring_chunk>* to_send, std::string* error);

  /// The current round has started and not finished.
  bool under_way() const { return started_ && !finished_; }
  /// The current round is finished: take_result() holds the sum.
  bool finished() const { return finished_; }
  /// The sum of every rank's contribution, valid until the next start(); the next round may
  /// start after this.
  const std::vector<float>& take_result();
  /// Rounds finished so far.
  int64_t rounds() const { return round_; }

  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  static int steps(int ranks) { return 2 * (ranks - 1); }
  /// Pieces per chunk.
  int pieces() const { return pieces_; }
  /// The bytes one rank sends in one round.
  int64_t bytes_sent_per_round() const;

 private:
  /// [first, last) of piece `piece` of chunk `chunk`.
  std::pair<int64_t, int64_t> piece_range(int chunk, int piece) const;
  int chunk_received_at(int step) const;
  ring_chunk piece_to_send(int step, int piece) const;
  /// Takes piece `piece` of step `step` into the buffer and sends it on, then the waiting
  /// steps of that piece that follow it.
  void take(int step, int piece, const float_view& values, std::vector<ring_chunk>* to_send);
  /// Why `chunk` cannot be taken now or later ("" when it can).
  std::string problem_with(const ring_chunk& chunk) const;

  int rank_;
  int ranks_;
  int64_t length_;
  int pieces_ = 1;
  int64_t round_ = 0;
  bool started_ = false;
  bool finished_ = false;
  bool sizes_only_ = false;
  /// Per piece, the step whose chunk comes next.
  std::vector<int> next_step_;
  int pieces_done_ = 0;
  /// Kept from round to round unless a chunk sent from it may still be on its way.
  std::shared_ptr<std::vector<float>> buffer_;
  /// Pieces that came before their turn (a faster neighbour, or a transport that does not keep
  /// their order), by round, piece and step.
  std::map<std::tuple<int64_t, int, int>, float_view> waiting_;
};

}  // namespace troupe::actors
