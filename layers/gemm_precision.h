#pragma once

// Reduced-precision GEMM operands, as the hardware sees them: rounding an fp32 value to
// TensorFloat-32 or bfloat16, the unit roundoff of each precision, and the names a job file
// uses. Header-only so that tests can reproduce the CPU backend's GEMM exactly.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "layers/backend.h"

namespace troupe::layers {

/// Mantissa bits of fp32 that `precision` drops: 0 for fp32, 13 for tf32 (10 kept), 16 for
/// bf16 (7 kept).
inline int dropped_mantissa_bits(math_precision precision) {
  switch (precision) {
    case math_precision::tf32:
      return 13;
    case math_precision::bf16:
      return 16;
    case math_precision::fp32:
      break;
  }
  return 0;
}

/// Half the spacing of `precision`'s values relative to their magnitude: 2^-24 (fp32), 2^-11
/// (tf32) or 2^-8 (bf16). Rounding a finite value x changes it by at most unit_roundoff * |x|
/// (short of overflow to infinity).
inline double unit_roundoff(math_precision precision) {
  return 1.0 / double(uint64_t{1} << (24 - dropped_mantissa_bits(precision)));
}

/// `value` rounded to the nearest value of `precision`, ties to even (the fp32 exponent range
/// is kept, as in tf32 and bf16). Infinities stay; a NaN stays a quiet NaN of its sign; a
/// finite value beyond the largest representable one rounds to infinity, as hardware does.
inline float round_to_precision(float value, math_precision precision) {
  const int dropped = dropped_mantissa_bits(precision);
  if (dropped == 0) return value;
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t mask = (uint32_t{1} << dropped) - 1;
  if ((bits & 0x7f800000u) == 0x7f800000u) {
    // Infinity has no mantissa bits to drop; a NaN keeps its quiet bit so it cannot become one.
    if ((bits & 0x007fffffu) != 0) bits = (bits & ~mask) | 0x00400000u;
  } else {
    // Adding just under half the dropped range, plus the lowest kept bit, carries into the kept
    // bits exactly when the dropped part is above half, or equal to half with an odd kept part.
    bits += (mask >> 1) + ((bits >> dropped) & 1u);
    bits &= ~mask;
  }
  float result = 0;
  std::memcpy(&result, &bits, sizeof result);
  return result;
}

/// The precision a job file names ("fp32", "tf32" or "bf16"); nothing for any other name.
inline std::optional<math_precision> math_precision_named(const std::string& name) {
  if (name == "fp32") return math_precision::fp32;
  if (name == "tf32") return math_precision::tf32;
  if (name == "bf16") return math_precision::bf16;
  return std::nullopt;
}

/// "fp32", "tf32" or "bf16".
inline const char* to_string(math_precision precision) {
  switch (precision) {
    case math_precision::tf32:
      return "tf32";
    case math_precision::bf16:
      return "bf16";
    case math_precision::fp32:
      break;
  }
  return "fp32";
}

}  // namespace troupe::layers
