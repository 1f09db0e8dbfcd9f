// Reduced-precision GEMMs on the CPU reference: the rounding to tf32 and bf16 (nearest, ties
// to even, NaN and infinity kept), GEMMs that equal an fp32 GEMM of pre-rounded operands bit
// for bit, the documented error bound against plain fp32, and the precision as per-stream
// state.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "layers/cpu/cpu_backend.h"
#include "layers/gemm_precision.h"
#include "layers/random.h"

namespace troupe::layers {
namespace {

constexpr math_precision reduced[] = {math_precision::tf32, math_precision::bf16};

float from_bits(uint32_t bits) {
  float value = 0;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

uint32_t bits_of(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

float tf32(float value) { return round_to_precision(value, math_precision::tf32); }
float bf16(float value) { return round_to_precision(value, math_precision::bf16); }

TEST(GemmPrecisionTest, NamesAndUnitRoundoff) {
  EXPECT_EQ(math_precision_named("fp32"), math_precision::fp32);
  EXPECT_EQ(math_precision_named("tf32"), math_precision::tf32);
  EXPECT_EQ(math_precision_named("bf16"), math_precision::bf16);
  EXPECT_FALSE(math_precision_named("fp16").has_value());
  EXPECT_STREQ(to_string(math_precision::bf16), "bf16");
  EXPECT_EQ(unit_roundoff(math_precision::fp32), std::ldexp(1.0, -24));
  EXPECT_EQ(unit_roundoff(math_precision::tf32), std::ldexp(1.0, -11));
  EXPECT_EQ(unit_roundoff(math_precision::bf16), std::ldexp(1.0, -8));
}

TEST(GemmPrecisionTest, RepresentableValuesAreUnchanged) {
  // Values whose dropped mantissa bits are zero, including the smallest normal and a
  // subnormal, keep their exact bits.
  for (float v : {0.0f, -0.0f, 1.0f, -2.5f, 1.0f + 0x1p-7f, 3.0f * 0x1p-100f, 0x1p-126f, 0x1p-133f,
                  -0x1.fcp127f}) {
    EXPECT_EQ(bits_of(bf16(v)), bits_of(v)) << v;
    EXPECT_EQ(bits_of(tf32(v)), bits_of(v)) << v;
  }
  for (float v : {1.0f + 0x1p-10f, -0x1.ffcp127f, 0x1p-136f}) {
    EXPECT_EQ(bits_of(tf32(v)), bits_of(v)) << v;
  }
  for (float v : {0.1f, 1.0f / 3.0f, -123.456f}) {
    EXPECT_EQ(bits_of(round_to_precision(v, math_precision::fp32)), bits_of(v));
  }
}

TEST(GemmPrecisionTest, RoundsToNearestWithTiesToEven) {
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
  EXPECT_EQ(bf16(1.0f + 0x1p-8f), 1.0f);                       // tie, down to even
  EXPECT_EQ(bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);         // tie, up to even
  EXPECT_EQ(bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above half
  EXPECT_EQ(bf16(1.0f + 0x1p-8f - 0x1p-20f), 1.0f);            // below half
  EXPECT_EQ(bf16(-(1.0f + 3 * 0x1p-8f)), -(1.0f + 0x1p-6f));   // signs are symmetric
  EXPECT_EQ(bf16(2.0f - 0x1p-8f), 2.0f);                       // tie carries into the exponent
  // tf32 keeps 10 mantissa bits: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(tf32(1.0f + 0x1p-11f), 1.0f);
  EXPECT_EQ(tf32(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);
  EXPECT_EQ(tf32(1.0f + 0x1p-11f + 0x1p-20f), 1.0f + 0x1p-10f);
  EXPECT_EQ(tf32(-(1.0f + 0x1p-11f)), -1.0f);
  // Subnormals round on the same grid of bits.
  EXPECT_EQ(bf16(0x1p-149f), 0.0f);
  EXPECT_EQ(bits_of(bf16(from_bits(0x00018000u))), 0x00020000u);  // tie to even, upwards
  EXPECT_EQ(bits_of(bf16(from_bits(0x00008000u))), 0x00000000u);  // tie to even, downwards
}

TEST(GemmPrecisionTest, KeepsInfinityAndNan) {
  const float infinity = std::numeric_limits<float>::infinity();
  for (math_precision p : reduced) {
    EXPECT_EQ(round_to_precision(infinity, p), infinity);
    EXPECT_EQ(round_to_precision(-infinity, p), -infinity);
    EXPECT_TRUE(std::isnan(round_to_precision(std::numeric_limits<float>::quiet_NaN(), p)));
    // A NaN whose payload lies only in the dropped bits must not turn into infinity.
    const float low_payload = round_to_precision(from_bits(0x7f800001u), p);
    EXPECT_TRUE(std::isnan(low_payload));
    EXPECT_EQ(bits_of(low_payload) & ((1u << dropped_mantissa_bits(p)) - 1), 0u);
    EXPECT_TRUE(std::signbit(round_to_precision(from_bits(0xff800001u), p)));
    // Beyond the largest finite value of the precision, rounding overflows as hardware does.
    EXPECT_EQ(round_to_precision(std::numeric_limits<float>::max(), p), infinity);
  }
}

TEST(GemmPrecisionTest, RoundingErrorIsWithinUnitRoundoff) {
  random_generator generator(5);
  for (math_precision p : reduced) {
    const double u = unit_roundoff(p);
    for (int i = 0; i < 100000; ++i) {
      const float v = std::ldexp(generator.uniform(-1.0f, 1.0f), int(generator.below(60)) - 30);
      const float r = round_to_precision(v, p);
      ASSERT_LE(std::fabs(double(r) - v), u * std::fabs(v)) << v;
      ASSERT_EQ(round_to_precision(r, p), r) << "rounding twice changes nothing";
    }
  }
}

// ---- GEMM on the CPU backend ------------------------------------------------------------------

struct gemm_case {
  transpose ta, tb;
  int m, n, k;
  float alpha, beta;
};

/// A, B (with padded strides) and C of one case, and GEMMs of them on one backend.
class gemm_fixture {
 public:
  gemm_fixture(backend& device, const gemm_case& g, uint64_t seed) : device_(device), g_(g) {
    lda_ = (g.ta == transpose::no ? g.k : g.m) + 3;
    ldb_ = (g.tb == transpose::no ? g.n : g.k) + 2;
    ldc_ = g.n + 4;
    a_ = values(size_t(g.ta == transpose::no ? g.m : g.k) * lda_, seed);
    b_ = values(size_t(g.tb == transpose::no ? g.k : g.n) * ldb_, seed + 1);
    c_ = values(size_t(g.m) * ldc_, seed + 2);
  }

  /// C after the GEMM on stream `s`, from operands rounded beforehand to `operands`.
  std::vector<float> run(stream s, math_precision operands) const {
    std::vector<float> a = a_, b = b_, c = c_;
    for (float& v : a) v = round_to_precision(v, operands);
    for (float& v : b) v = round_to_precision(v, operands);
    device_.gemm(s, g_.ta, g_.tb, g_.m, g_.n, g_.k, g_.alpha, a.data(), lda_, b.data(), ldb_,
                 g_.beta, c.data(), ldc_);
    return c;
  }

  /// |alpha| sum_k |a_ik b_kj| + |beta c_ij| for every element of C: what the error bound of
  /// backend::set_gemm_precision scales with.
  std::vector<double> magnitudes() const {
    std::vector<double> result(c_.size(), 0.0);
    for (int i = 0; i < g_.m; ++i) {
      for (int j = 0; j < g_.n; ++j) {
        double total = 0;
        for (int p = 0; p < g_.k; ++p) total += std::fabs(double(a_at(i, p)) * b_at(p, j));
        result[size_t(i) * ldc_ + j] =
            std::fabs(g_.alpha) * total + std::fabs(g_.beta * c_[size_t(i) * ldc_ + j]);
      }
    }
    return result;
  }

 private:
  static std::vector<float> values(size_t count, uint64_t seed) {
    random_generator generator(seed);
    std::vector<float> result(count);
    for (float& v : result) v = generator.uniform(-1.0f, 1.0f);
    return result;
  }
  float a_at(int i, int p) const {
    return g_.ta == transpose::no ? a_[size_t(i) * lda_ + p] : a_[size_t(p) * lda_ + i];
  }
  float b_at(int p, int j) const {
    return g_.tb == transpose::no ? b_[size_t(p) * ldb_ + j] : b_[size_t(j) * ldb_ + p];
  }

  backend& device_;
  gemm_case g_;
  int lda_ = 0, ldb_ = 0, ldc_ = 0;
  std::vector<float> a_, b_, c_;
};

std::vector<gemm_case> gemm_cases() {
  std::vector<gemm_case> cases;
  for (transpose ta : {transpose::no, transpose::yes}) {
    for (transpose tb : {transpose::no, transpose::yes}) {
      cases.push_back({ta, tb, 37, 29, 53, 0.75f, 0.5f});
      cases.push_back({ta, tb, 1, 1, 1, 1.0f, 0.0f});
      // Large enough for the backend to split C over its threads.
      cases.push_back({ta, tb, 160, 144, 112, -1.25f, 0.0f});
    }
  }
  return cases;
}

std::string describe(const gemm_case& g, math_precision p) {
  return std::string(to_string(p)) + " " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" +
         std::to_string(g.k) + " ta " + std::to_string(int(g.ta)) + " tb " +
         std::to_string(int(g.tb));
}

TEST(GemmPrecisionTest, CpuGemmEqualsFp32GemmOfRoundedOperands) {
  auto device = make_cpu_backend(2);
  const stream rounded = device->create_stream();
  const stream plain = device->default_stream();
  for (math_precision p : reduced) {
    device->set_gemm_precision(rounded, p);
    for (const gemm_case& g : gemm_cases()) {
      gemm_fixture fixture(*device, g, 17);
      EXPECT_EQ(fixture.run(rounded, math_precision::fp32), fixture.run(plain, p))
          << describe(g, p);
    }
  }
  device->destroy_stream(rounded);
}

TEST(GemmPrecisionTest, CpuGemmDiffersFromFp32WithinTheDocumentedBound) {
  // backend.h: |C_p - C_fp32| <= (2u + u^2) |alpha| sum |a b| (each product of rounded
  // operands is within (1 + u)^2 - 1 of the exact one), plus the fp32 rounding of both results:
  // at most (k + 2) * 2^-24 of |alpha| sum |a b| + |beta c| each (products, sums, alpha and
  // beta), so (2k + 4) * 2^-24 of it together; the test allows twice that.
  auto device = make_cpu_backend(2);
  const stream rounded = device->create_stream();
  for (math_precision p : reduced) {
    device->set_gemm_precision(rounded, p);
    const double u = unit_roundoff(p);
    for (const gemm_case& g : gemm_cases()) {
      gemm_fixture fixture(*device, g, 23);
      const std::vector<float> expected =
          fixture.run(device->default_stream(), math_precision::fp32);
      const std::vector<float> actual = fixture.run(rounded, math_precision::fp32);
      const std::vector<double> scale = fixture.magnitudes();
      const double relative = 2 * u + u * u + (4.0 * g.k + 8) * std::ldexp(1.0, -24);
      size_t differing = 0;
      for (size_t i = 0; i < expected.size(); ++i) {
        ASSERT_LE(std::fabs(double(actual[i]) - expected[i]), relative * scale[i] + 1e-30)
            << describe(g, p) << " at " << i;
        differing += actual[i] != expected[i];
      }
      // Rounding really happened (a 1x1x1 product may happen to be exact).
      if (g.k > 1) {
        EXPECT_GT(differing, 0u) << describe(g, p);
      }
    }
  }
  device->destroy_stream(rounded);
}

TEST(GemmPrecisionTest, PrecisionBelongsToOneStream) {
  auto device = make_cpu_backend(1);
  const stream first = device->create_stream();
  const stream second = device->create_stream();
  EXPECT_NE(first.handle, second.handle);
  EXPECT_NE(first.handle, device->default_stream().handle);
  device->set_gemm_precision(first, math_precision::bf16);
  const gemm_case g{transpose::no, transpose::yes, 9, 7, 33, 1.0f, 0.0f};
  gemm_fixture fixture(*device, g, 31);
  const std::vector<float> fp32 = fixture.run(device->default_stream(), math_precision::fp32);
  EXPECT_EQ(fixture.run(second, math_precision::fp32), fp32);
  EXPECT_NE(fixture.run(first, math_precision::fp32), fp32);
  // Back at fp32, the stream computes exactly what it did before.
  device->set_gemm_precision(first, math_precision::fp32);
  EXPECT_EQ(fixture.run(first, math_precision::fp32), fp32);
  device->set_gemm_precision(device->default_stream(), math_precision::tf32);
  EXPECT_EQ(fixture.run(device->default_stream(), math_precision::fp32),
            fixture.run(second, math_precision::tf32));
  device->destroy_stream(first);
  device->destroy_stream(second);
}

}  // namespace
}  // namespace troupe::layers
