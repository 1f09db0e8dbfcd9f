// A seeded synthetic classification set: Gaussian clusters around random class prototypes.

#include <cmath>
#include <vector>

#include "layers/check.h"
#include "layers/dataset.h"
#include "layers/random.h"

namespace troupe::layers {
namespace {

// Expected distance between two class prototypes, in units of the noise deviation. At 4 the
// best classifier confuses a pair of classes about 2% of the time (Φ(-2)), so a linear model
// fits most samples but never all of them, whatever the sample size.
constexpr double prototype_separation = 4.0;
constexpr double two_pi = 6.283185307179586;

/// Standard normal numbers by the Box-Muller transform, using both outputs of each pair.
class gaussian_source {
 public:
  explicit gaussian_source(uint64_t seed) : generator_(seed) {}

  float next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // 1 - uniform() lies in (0, 1], so the logarithm is finite.
    double radius = std::sqrt(-2.0 * std::log(1.0 - generator_.uniform()));
    double angle = two_pi * generator_.uniform();
    spare_ = static_cast<float>(radius * std::sin(angle));
    has_spare_ = true;
    return static_cast<float>(radius * std::cos(angle));
  }

  uint64_t below(uint64_t bound) { return generator_.below(bound); }

 private:
  random_generator generator_;
  float spare_ = 0.0f;
  bool has_spare_ = false;
};

// Entries uniform in [-scale, scale]; the scale shrinks with the sample size so that the
// distance between prototypes (and so the difficulty) does not depend on it.
std::vector<float> make_prototypes(int classes, int64_t sample_size, uint64_t seed) {
  // Two coordinates uniform in [-s, s] differ by s²·2/3 in mean square.
  double scale = prototype_separation * std::sqrt(1.5 / static_cast<double>(sample_size));
  random_generator generator(seed);
  std::vector<float> prototypes(static_cast<size_t>(classes * sample_size));
  for (float& value : prototypes) {
    value = static_cast<float>(scale * generator.uniform(-1.0f, 1.0f));
  }
  return prototypes;
}

}  // namespace

dataset make_synthetic_dataset(int64_t count, const shape& sample_shape, int classes,
                               uint64_t seed) {
  TROUPE_CHECK(count >= 0);
  TROUPE_CHECK(classes > 0);
  dataset data;
  data.name = "synthetic";
  data.sample_shape = sample_shape;
  data.classes = classes;
  const int64_t sample_size = data.sample_size();
  TROUPE_CHECK(sample_size > 0);
  std::vector<float> prototypes = make_prototypes(classes, sample_size, derive_seed(seed, 0));
  gaussian_source noise(derive_seed(seed, 1));
  data.labels.resize(static_cast<size_t>(count));
  data.features.resize(static_cast<size_t>(count * sample_size));
  for (int64_t i = 0; i < count; ++i) {
    auto label = static_cast<int32_t>(noise.below(static_cast<uint64_t>(classes)));
    data.labels[i] = label;
    const float* prototype = &prototypes[label * sample_size];
    float* sample = &data.features[i * sample_size];
    for (int64_t j = 0; j < sample_size; ++j) sample[j] = prototype[j] + noise.next();
  }
  return data;
}

}  // namespace troupe::layers
