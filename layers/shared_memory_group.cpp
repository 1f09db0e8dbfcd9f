// The shared-memory group: a round is two barriers. At the first every rank has published its
// buffer; each then adds all buffers in rank order into its own scratch (so every rank gets the
// same bits), and at the second every rank has finished reading the others' buffers and may
// overwrite its own.

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "layers/device_group.h"
#include "layers/thread_barrier.h"

namespace troupe::layers {
namespace {

struct shared_round {
  explicit shared_round(int ranks) : buffers(ranks), arrived(ranks) {}
  /// Each rank's buffers of the round under way.
  std::vector<const std::vector<device_span>*> buffers;
  thread_barrier arrived;
};

bool same_counts(const std::vector<device_span>& a, const std::vector<device_span>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].count != b[i].count) return false;
  }
  return true;
}

class shared_memory_rank final : public device_group {
 public:
  shared_memory_rank(std::shared_ptr<shared_round> round, int rank)
      : round_(std::move(round)), rank_(rank) {}

  int rank() const override { return rank_; }
  int ranks() const override { return static_cast<int>(round_->buffers.size()); }
  std::string kind() const override { return "shared memory"; }

  void all_reduce_sum(stream, const std::vector<device_span>& buffers) override {
    round_->buffers[rank_] = &buffers;
    round_->arrived.arrive_and_wait();
    for (const std::vector<device_span>* other : round_->buffers) {
      if (!same_counts(*other, buffers)) std::abort();
    }
    sums_.resize(buffers.size());
    for (size_t b = 0; b < buffers.size(); ++b) {
      std::vector<float>& sum = sums_[b];
      sum.assign(buffers[b].count, 0.0f);
      for (const std::vector<device_span>* rank_buffers : round_->buffers) {
        const float* values = (*rank_buffers)[b].data;
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += values[i];
      }
    }
    round_->arrived.arrive_and_wait();  // every rank has read every buffer
    for (size_t b = 0; b < buffers.size(); ++b) {
      std::copy(sums_[b].begin(), sums_[b].end(), buffers[b].data);
    }
  }

 private:
  std::shared_ptr<shared_round> round_;
  const int rank_;
  std::vector<std::vector<float>> sums_;
};

}  // namespace

std::vector<std::unique_ptr<device_group>> make_shared_memory_group(int ranks) {
  auto round = std::make_shared<shared_round>(ranks);
  std::vector<std::unique_ptr<device_group>> group;
  for (int rank = 0; rank < ranks; ++rank) {
    group.push_back(std::make_unique<shared_memory_rank>(round, rank));
  }
  return group;
}

}  // namespace troupe::layers
