// The CPU backend's thread pool, and that splitting work over it changes no result beyond
// rounding: elementwise work is bit-identical, GEMMs agree to float precision (OpenBLAS may
// block the k loop differently for a narrower C).

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <tuple>

#include "layers/cpu/cpu_thread_pool.h"
#include "tests/support/test_helpers.h"

namespace troupe::layers {
namespace {

TEST(CpuThreadPoolTest, RunsEveryPartOnceAcrossManyRounds) {
  cpu::thread_pool pool(3);
  EXPECT_EQ(pool.threads(), 3);
  std::vector<std::atomic<int>> counts(3);
  for (int round = 0; round < 2000; ++round) {
    const int parts = 1 + round % 3;
    pool.run(parts, [&](int part) { counts[part].fetch_add(1); });
  }
  EXPECT_EQ(counts[0].load(), 2000);
  EXPECT_EQ(counts[1].load(), 1333);
  EXPECT_EQ(counts[2].load(), 666);
}

TEST(CpuThreadPoolTest, SplitPointsCoverTheRangeOnGrainBoundaries) {
  for (size_t count : {0ul, 1ul, 15ul, 16ul, 17ul, 1000ul}) {
    for (int parts = 1; parts <= 4; ++parts) {
      EXPECT_EQ(cpu::split_point(count, parts, 0, 16), 0u);
      EXPECT_EQ(cpu::split_point(count, parts, parts, 16), count);
      for (int part = 0; part < parts; ++part) {
        const size_t begin = cpu::split_point(count, parts, part, 16);
        EXPECT_LE(begin, cpu::split_point(count, parts, part + 1, 16));
        EXPECT_TRUE(begin % 16 == 0 || begin == count);
      }
    }
  }
}

struct gemm_case {
  transpose a, b;
  int m, n, k;
};

std::vector<float> run_gemm(backend& device, const gemm_case& g, float beta) {
  stream s = device.default_stream();
  const int lda = (g.a == transpose::no ? g.k : g.m) + 3;
  const int ldb = (g.b == transpose::no ? g.n : g.k) + 1;
  const int ldc = g.n + 2;
  const int a_rows = g.a == transpose::no ? g.m : g.k;
  const int b_rows = g.b == transpose::no ? g.k : g.n;
  auto a = testing::random_tensor(device, {a_rows, lda}, 1);
  auto b = testing::random_tensor(device, {b_rows, ldb}, 2);
  auto c = testing::random_tensor(device, {g.m, ldc}, 3);
  device.gemm(s, g.a, g.b, g.m, g.n, g.k, 0.5f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  return c.to_host(s);
}

TEST(CpuThreadPoolTest, SplitGemmEqualsSingleThreadedGemm) {
  std::string error;
  auto one = create_backend("cpu", 1, &error);
  auto two = create_backend("cpu", 2, &error);
  const transpose no = transpose::no, yes = transpose::yes;
  for (const gemm_case& g : {gemm_case{no, yes, 64, 1024, 784}, gemm_case{yes, no, 1024, 784, 64},
                             gemm_case{no, no, 64, 784, 1024}, gemm_case{yes, yes, 333, 130, 99},
                             gemm_case{no, no, 1000, 70, 200}}) {
    for (float beta : {0.0f, 1.0f}) {
      const auto expected = run_gemm(*one, g, beta), actual = run_gemm(*two, g, beta);
      ASSERT_EQ(expected.size(), actual.size());
      for (size_t i = 0; i < expected.size(); ++i) {
        ASSERT_NEAR(expected[i], actual[i], 1e-5f * (1.0f + std::fabs(expected[i])))
            << g.m << "x" << g.n << "x" << g.k << " beta " << beta << " element " << i;
      }
    }
  }
}

TEST(CpuThreadPoolTest, SplitElementwiseWorkEqualsSingleThreadedExactly) {
  std::string error;
  auto one = create_backend("cpu", 1, &error);
  auto two = create_backend("cpu", 2, &error);
  auto run = [](backend& device) {
    stream s = device.default_stream();
    const int64_t n = 300001;
    auto w = testing::random_tensor(device, {n}, 4);
    auto g = testing::random_tensor(device, {n}, 5);
    auto v = testing::random_tensor(device, {n}, 6);
    device.sgd_step(s, w.data(), g.data(), v.data(), n, sgd_parameters{0.1f, 0.9f, 0.01f, 1.0f});
    auto m1 = tensor::filled(device, s, {n}, 0.0f), m2 = tensor::filled(device, s, {n}, 0.0f);
    device.adam_step(s, w.data(), g.data(), m1.data(), m2.data(), n, adam_parameters{});
    convolution_geometry geometry{5, 3, 9, 9, 3, 1, 1, 9, 9};
    auto image = testing::random_tensor(device, {5, 3, 9, 9}, 7);
    tensor columns(device, {5 * 81, 27});
    device.im2col(s, geometry, image.data(), columns.data());
    tensor back(device, {5, 3, 9, 9});
    device.col2im(s, geometry, columns.data(), back.data());
    tensor dropped(device, {n}), mask(device, {n});
    device.dropout_forward(s, g.data(), dropped.data(), mask.data(), n, 0.3f, 11, 5);
    return std::make_tuple(w.to_host(s), v.to_host(s), columns.to_host(s), back.to_host(s),
                           dropped.to_host(s));
  };
  EXPECT_TRUE(run(*one) == run(*two));
}

}  // namespace
}  // namespace troupe::layers
