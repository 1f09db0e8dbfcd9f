#include "actors/engine/ring_all_reduce.h"

#include "layers/check.h"

namespace troupe::actors {

ring_all_reduce::ring_all_reduce(int rank, int ranks, int64_t length)
    : rank_(rank), ranks_(ranks), length_(length) {
  TROUPE_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && length >= 0);
}

std::pair<int64_t, int64_t> ring_all_reduce::chunk_range(int chunk) const {
  return {length_ * chunk / ranks_, length_ * (chunk + 1) / ranks_};
}

static int wrap(int value, int ranks) { return ((value % ranks) + ranks) % ranks; }

int ring_all_reduce::chunk_received_at(int step) const { return wrap(rank_ - step - 1, ranks_); }

ring_chunk ring_all_reduce::chunk_to_send(int step) const {
  const auto [first, last] = chunk_range(wrap(rank_ - step, ranks_));
  return {round_, step,
          std::make_shared<const std::vector<float>>(buffer_.begin() + first,
                                                     buffer_.begin() + last)};
}

int64_t ring_all_reduce::bytes_sent_per_round() const {
  int64_t bytes = 0;
  for (int step = 0; step < steps(ranks_); ++step) {
    const auto [first, last] = chunk_range(wrap(rank_ - step, ranks_));
    bytes += (last - first) * static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

std::vector<ring_chunk> ring_all_reduce::start(std::vector<float> values) {
  TROUPE_CHECK(!started_ && static_cast<int64_t>(values.size()) == length_);
  buffer_ = std::move(values);
  started_ = true;
  next_step_ = 0;
  std::vector<ring_chunk> to_send;
  if (ranks_ == 1) {
    finished_ = true;
    return to_send;
  }
  to_send.push_back(chunk_to_send(0));
  // Chunks a faster neighbour sent before this rank began, in their order.
  auto early = std::move(early_);
  early_.clear();
  for (auto& [step, values] : early) take(step, *values, &to_send);
  return to_send;
}

void ring_all_reduce::take(int step, const std::vector<float>& values,
                           std::vector<ring_chunk>* to_send) {
  const auto [first, last] = chunk_range(chunk_received_at(step));
  float* target = buffer_.data() + first;
  if (step < ranks_ - 1) {
    for (int64_t i = 0; i < last - first; ++i) target[i] += values[i];
  } else {
    std::copy(values.begin(), values.end(), target);
  }
  next_step_ = step + 1;
  if (next_step_ == steps(ranks_)) {
    finished_ = true;
    return;
  }
  to_send->push_back(chunk_to_send(next_step_));
}

bool ring_all_reduce::receive(const ring_chunk& chunk, std::vector<ring_chunk>* to_send,
                              std::string* error) {
  const int expected = started_ ? next_step_ : static_cast<int>(early_.size());
  if (chunk.round != round_ || finished_ || chunk.step != expected || !chunk.values) {
    *error = "a ring chunk of round " + std::to_string(chunk.round) + " step " +
             std::to_string(chunk.step) + "; this rank expects round " + std::to_string(round_) +
             (finished_ ? " to be taken" : " step " + std::to_string(expected));
    return false;
  }
  const auto [first, last] = chunk_range(chunk_received_at(chunk.step));
  if (static_cast<int64_t>(chunk.values->size()) != last - first) {
    *error = "a ring chunk of " + std::to_string(chunk.values->size()) + " values at step " +
             std::to_string(chunk.step) + "; it holds " + std::to_string(last - first);
    return false;
  }
  if (!started_) {
    // Only the reduce-scatter's steps can come before this rank's own contribution.
    if (chunk.step >= ranks_ - 1) {
      *error = "an all-gather chunk before this rank began its round";
      return false;
    }
    early_[chunk.step] = chunk.values;
    return true;
  }
  take(chunk.step, *chunk.values, to_send);
  return true;
}

std::vector<float> ring_all_reduce::take_result() {
  TROUPE_CHECK(finished_);
  finished_ = false;
  started_ = false;
  ++round_;
  return std::move(buffer_);
}

}  // namespace troupe::actors
