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

ring_all_reduce::ring_all_reduce(int rank, int ranks, int64_t length, int64_t piece_floats)
    : rank_(rank), ranks_(ranks), length_(length) {
  TROUPE_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && length >= 0 && piece_floats >= 1);
  const int64_t largest_chunk = (length + ranks - 1) / ranks;
  pieces_ = static_cast<int>(std::max<int64_t>(1, (largest_chunk + piece_floats - 1) / piece_floats));
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
  TROUPE_CHECK(!started_ && static_cast<int64_t>(values.size()) == length_);
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
  // Pieces a faster neighbour sent before this rank began, each piece's in their order.
  auto early = std::move(early_);
  early_.clear();
  for (auto& [where, values] : early) take(where.second, where.first, values, &to_send);
  return to_send;
}

void ring_all_reduce::take(int step, int piece, const float_view& values,
                           std::vector<ring_chunk>* to_send) {
  const auto [first, last] = piece_range(chunk_received_at(step), piece);
  float* target = buffer_->data() + first;
  const float* source = values.data;
  if (step < ranks_ - 1) {
    for (int64_t i = 0; i < last - first; ++i) target[i] += source[i];
  } else {
    std::copy(source, source + (last - first), target);
  }
  const int next = ++next_step_[static_cast<size_t>(piece)];
  if (next == steps(ranks_)) {
    if (++pieces_done_ == pieces_) finished_ = true;
    return;
  }
  to_send->push_back(piece_to_send(next, piece));
}

bool ring_all_reduce::receive(const ring_chunk& chunk, std::vector<ring_chunk>* to_send,
                              std::string* error) {
  if (chunk.piece < 0 || chunk.piece >= pieces_) {
    *error = "a ring chunk of piece " + std::to_string(chunk.piece) + "; chunks here travel in " +
             std::to_string(pieces_) + " piece(s)";
    return false;
  }
  int expected = next_step_[static_cast<size_t>(chunk.piece)];
  if (!started_) {
    expected = 0;
    while (early_.count({chunk.piece, expected})) ++expected;
  }
  if (chunk.round != round_ || finished_ || chunk.step != expected ||
      (chunk.values.data == nullptr && chunk.values.count != 0)) {
    *error = "a ring chunk of round " + std::to_string(chunk.round) + " step " +
             std::to_string(chunk.step) + "; this rank expects round " + std::to_string(round_) +
             (finished_ ? " to be taken" : " step " + std::to_string(expected));
    return false;
  }
  const auto [first, last] = piece_range(chunk_received_at(chunk.step), chunk.piece);
  if (chunk.values.count != last - first) {
    *error = "a ring chunk of " + std::to_string(chunk.values.count) + " values at step " +
             std::to_string(chunk.step) + "; it holds " + std::to_string(last - first);
    return false;
  }
  if (!started_) {
    // Only the reduce-scatter's steps can come before this rank's own contribution.
    if (chunk.step >= ranks_ - 1) {
      *error = "an all-gather chunk before this rank began its round";
      return false;
    }
    early_[{chunk.piece, chunk.step}] = chunk.values;
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
