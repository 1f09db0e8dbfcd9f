#pragma once

// A branch-free float tanh that GCC vectorizes (libm's tanhf is a call, which it cannot). It
// stays within 1.5 ulp of the exact tanh and gives the same result on every run.
//
// GCC will not if-convert a select whose one side needs a division (it "could trap"), nor a
// clamp against a constant bound (it threads the constant path into a branch). So every lane
// computes every case, out-of-range lanes compute garbage, and a bitwise blend picks the result.

#include <cmath>
#include <cstdint>
#include <cstring>

namespace troupe::layers::cpu {

/// e^x for x in [-87, 88]; other inputs give unspecified values (never undefined behaviour).
inline float exp_in_range(float x) {
  // n = round(x / ln 2) with the 1.5·2^23 trick: the low mantissa bits of `shifted` hold n.
  const float shifter = 12582912.0f;
  const float shifted = x * 1.44269504088896341f + shifter;
  const float n = shifted - shifter;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln 2 split for exactness
  // Cephes' expf polynomial for e^r on |r| <= ln(2)/2.
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float mantissa = p * r * r + r + 1.0f;
  uint32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  const uint32_t exponent_bits = (bits + 127u - 0x4b400000u) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &exponent_bits, sizeof scale);
  return mantissa * scale;
}

/// condition ? if_true : if_false, without a branch or a select that GCC could turn into one.
inline float blend(bool condition, float if_true, float if_false) {
  uint32_t true_bits, false_bits;
  std::memcpy(&true_bits, &if_true, sizeof true_bits);
  std::memcpy(&false_bits, &if_false, sizeof false_bits);
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  const uint32_t bits = (true_bits & mask) | (false_bits & ~mask);
  float result;
  std::memcpy(&result, &bits, sizeof result);
  return result;
}

/// tanh(x): Cephes' odd polynomial below |x| = 0.625, 1 - 2 / (e^(2|x|) + 1) up to 9, where
/// tanh rounds to ±1. NaN stays NaN.
inline float tanh_vectorizable(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * a + a;
  const float large = 1.0f - 2.0f / (exp_in_range(2.0f * a) + 1.0f);
  const float magnitude = blend(a < 0.625f, small, blend(a > 9.0f, 1.0f, large));
  return std::copysign(magnitude, x);
}

/// The standard normal CDF Φ(x) = (1 + erf(x / √2)) / 2, within 1e-7 of the exact value and
/// with the relative accuracy of erfc in the lower tail. Abramowitz & Stegun 7.1.26 gives
/// erfc(a) ≈ (a1 t + ... + a5 t^5) e^(-a²) with t = 1 / (1 + p a) for a >= 0 (absolute error
/// below 1.5e-7); the lower tail takes erfc(|a|) as it is instead of 1 - erf, so no cancellation.
inline float normal_cdf_vectorizable(float x) {
  const float a = std::fabs(x) * 0.70710678118654752440f;
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  const float poly =
      t * (0.254829592f +
           t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float square = a * a;
  const float tail = blend(square > 87.0f, 0.0f, poly * exp_in_range(-square));  // erfc(a)
  return blend(x >= 0.0f, 1.0f - 0.5f * tail, 0.5f * tail);
}

/// The standard normal density φ(x), vectorizable; 0 where it underflows.
inline float normal_pdf_vectorizable(float x) {
  const float half_square = 0.5f * x * x;
  return blend(half_square > 87.0f, 0.0f, 0.39894228040143267794f * exp_in_range(-half_square));
}

}  // namespace troupe::layers::cpu
