#pragma once

// Seeded, portable random numbers. Everything random in troupe (initialization, shuffling,
// dropout) comes from here, never from std::random_device or from std:: distributions whose
// output differs between standard libraries. The counter-based functions are also compiled
// into device code, so the CPU and CUDA backends draw identical dropout masks.

#include <cstdint>

#if defined(__CUDACC__)
#define TROUPE_HOST_DEVICE __host__ __device__
#else
#define TROUPE_HOST_DEVICE
#endif

namespace troupe::layers {

/// SplitMix64's finalizer: a bijective 64-bit mix.
TROUPE_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A uniform float in [0, 1) that depends only on (seed, counter), with 24 bits of precision.
TROUPE_HOST_DEVICE inline float uniform_at(uint64_t seed, uint64_t counter) {
  uint64_t bits = mix64(seed ^ mix64(counter));
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

/// Whether dropout keeps element `counter` of the stream named by `seed`.
TROUPE_HOST_DEVICE inline bool dropout_keep(uint64_t seed, uint64_t counter, float probability) {
  return uniform_at(seed, counter) >= probability;
}

/// Derives an independent seed for a named purpose (a layer index, an epoch) from a parent.
TROUPE_HOST_DEVICE inline uint64_t derive_seed(uint64_t parent, uint64_t purpose) {
  return mix64(parent ^ mix64(purpose + 0x5851f42d4c957f2dULL));
}

/// A sequential generator (SplitMix64) for host-side use: initialization and shuffling.
class random_generator {
 public:
  explicit random_generator(uint64_t seed) : state_(seed) {}

  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t x = state_;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }

  /// Uniform in [0, 1) with 24 bits of precision.
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }

  /// Uniform in [low, high).
  float uniform(float low, float high) { return low + (high - low) * uniform(); }

  /// Uniform integer in [0, bound) without modulo bias (Lemire's method); bound > 0.
  uint64_t below(uint64_t bound) {
    unsigned __int128 product = static_cast<unsigned __int128>(next()) * bound;
    uint64_t low = static_cast<uint64_t>(product);
    if (low < bound) {
      uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        product = static_cast<unsigned __int128>(next()) * bound;
        low = static_cast<uint64_t>(product);
      }
    }
    return static_cast<uint64_t>(product >> 64);
  }

  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

}  // namespace troupe::layers
