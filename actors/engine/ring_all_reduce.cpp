#include "actors/engine/ring_all_reduce.h"

#include <algorithm>

#include "layers/check.h"

namespace troupe::actors {

float_view float_view::of(std::shared_ptr<const std::vector<float>> values) {
  float_view view;
  view.data = values->data();
  view.count = static_cast<int64_t>(values->size());
  view.owner = std::move(values);
  return view;
}

ring_all_reduce::ring_all_reduce(int rank, int ranks, int64_t length, int64_t piece_floats,
                                 bool sizes_only)
    : rank_(rank), ranks_(ranks), length_(length), sizes_only_(sizes_only) {
  TROUPE_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && length >= 0 && piece_floats >= 1);
  const int64_t largest_chunk = (length + ranks - 1) / ranks;
  pieces_ =
      static_cast<int>(std::max<int64_t>(1, (largest_chunk + piece_floats - 1) / piece_floats));
  next_step_.assign(static_cast<size_t>(pieces_), 0);
}

static int wrap(int value, int ranks) { return ((value % ranks) + ranks) % ranks; }

std::pair<int64_t, int64_t> ring_all_reduce::piece_range(int chunk, int piece) const {
  const int64_t first = length_ * chunk / ranks_, last = length_ * (chunk + 1) / ranks_;
  return {first + (last - first) * piece / pieces_, first + (last - first) * (piece + 1) / pieces_};
}

int ring_all_reduce::chunk_received_at(int step) const { return wrap(rank_ - step - 1, ranks_); }

ring_chunk ring_all_reduce::piece_to_send(int step, int piece) const {
  const auto [first, last] = piece_range(wrap(rank_ - step, ranks_), piece);
  if (sizes_only_) return {round_, step, piece, float_view{nullptr, nullptr, last - first}};
  return {round_, step, piece, float_view{buffer_, buffer_->data() + first, last - first}};
}

int64_t ring_all_reduce::bytes_sent_per_round() const {
  int64_t bytes = 0;
  for (int step = 0; step < steps(ranks_); ++step) {
    const int chunk = wrap(rank_ - step, ranks_);
    const int64_t count = length_ * (chunk + 1) / ranks_ - length_ * chunk / ranks_;
    bytes += count * static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

std::vector<ring_chunk> ring_all_reduce::start(const std::vector<float>& values) {
  TROUPE_CHECK(!started_ && static_cast<int64_t>(values.size()) == (sizes_only_ ? 0 : length_));
  // A chunk of the last round may still be on its way (in a socket's queue): then a fresh
  // buffer, else the old one, whose pages are already mapped.
  if (!buffer_ || buffer_.use_count() > 1) buffer_ = std::make_shared<std::vector<float>>();
  buffer_->assign(values.begin(), values.end());
  started_ = true;
  std::fill(next_step_.begin(), next_step_.end(), 0);
  pieces_done_ = 0;
  std::vector<ring_chunk> to_send;
  if (ranks_ == 1) {
    finished_ = true;
    return to_send;
  }
  for (int piece = 0; piece < pieces_; ++piece) to_send.push_back(piece_to_send(0, piece));
  // Pieces a faster neighbour sent before this rank began.
  for (int piece = 0; piece < pieces_; ++piece) {
    auto first = waiting_.find({round_, piece, 0});
    if (first == waiting_.end()) continue;
    const float_view values = first->second;
    waiting_.erase(first);
    take(0, piece, values, &to_send);
  }
  return to_send;
}

void ring_all_reduce::take(int step, int piece, const float_view& values,
                           std::vector<ring_chunk>* to_send) {
  for (float_view current = values;;) {
    const auto [first, last] = piece_range(chunk_received_at(step), piece);
    float* target = buffer_->data() + first;
    const float* source = current.data;
    if (sizes_only_) {
      // Sizes only: nothing to add.
    } else if (step < ranks_ - 1) {
      for (int64_t i = 0; i < last - first; ++i) target[i] += source[i];
    } else {
      std::copy(source, source + (last - first), target);
    }
    step = ++next_step_[static_cast<size_t>(piece)];
    if (step == steps(ranks_)) {
      if (++pieces_done_ == pieces_) finished_ = true;
      return;
    }
    to_send->push_back(piece_to_send(step, piece));
    auto next = waiting_.find({round_, piece, step});
    if (next == waiting_.end()) return;
    current = next->second;
    waiting_.erase(next);
  }
}

std::string ring_all_reduce::problem_with(const ring_chunk& chunk) const {
  if (chunk.piece < 0 || chunk.piece >= pieces_) {
    return "a ring chunk of piece " + std::to_string(chunk.piece) + "; chunks here travel in " +
           std::to_string(pieces_) + " piece(s)";
  }
  // This round's steps not taken yet, or the next round's reduce-scatter steps (which a
  // neighbour can send once it has this round's sum).
  const bool this_round = chunk.round == round_ && !finished_;
  const bool next_round = chunk.round == round_ + 1 && chunk.step < ranks_ - 1;
  const int taken =
      started_ && chunk.round == round_ ? next_step_[static_cast<size_t>(chunk.piece)] : 0;
  const bool fits_round =
      (this_round && chunk.step >= taken && chunk.step < steps(ranks_)) || next_round;
  if (!fits_round || waiting_.count({chunk.round, chunk.piece, chunk.step})) {
    return "a ring chunk of round " + std::to_string(chunk.round) + " step " +
           std::to_string(chunk.step) + " piece " + std::to_string(chunk.piece) +
           "; this rank is at round " + std::to_string(round_) +
           (finished_ ? ", finished" : " step " + std::to_string(taken)) +
           (waiting_.count({chunk.round, chunk.piece, chunk.step}) ? " and holds it already" : "");
  }
  if (chunk.round == round_ && !started_ && chunk.step >= ranks_ - 1) {
    return "an all-gather chunk before this rank began its round";
  }
  if (chunk.values.data == nullptr && chunk.values.count != 0 && !sizes_only_) {
    return "a ring chunk without values";
  }
  const auto [first, last] = piece_range(chunk_received_at(chunk.step), chunk.piece);
  if (chunk.values.count != last - first) {
    return "a ring chunk of " + std::to_string(chunk.values.count) + " values at step " +
           std::to_string(chunk.step) + "; it holds " + std::to_string(last - first);
  }
  return "";
}

bool ring_all_reduce::receive(const ring_chunk& chunk, std::vector<ring_chunk>* to_send,
                              std::string* error) {
  const std::string problem = problem_with(chunk);
  if (!problem.empty()) {
    *error = problem;
    return false;
  }
  const bool now = started_ && chunk.round == round_ &&
                   chunk.step == next_step_[static_cast<size_t>(chunk.piece)];
  if (!now) {
    waiting_[{chunk.round, chunk.piece, chunk.step}] = chunk.values;
    return true;
  }
  take(chunk.step, chunk.piece, chunk.values, to_send);
  return true;
}

const std::vector<float>& ring_all_reduce::take_result() {
  TROUPE_CHECK(finished_);
  finished_ = false;
  started_ = false;
  ++round_;
  return *buffer_;
}

}  // namespace troupe::actors
