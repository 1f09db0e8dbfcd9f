// Parity of the CUDA backend with the CPU reference: every operation runs on both with the same
// inputs and the results are compared (exactly where no rounding is involved). Every test skips
// itself when no CUDA device is present, so this file builds and passes on CPU-only machines.

#include "layers/gemm_precision.h"
#include "tests/layers/cuda_test_support.h"

namespace troupe::layers {
namespace {

using namespace cuda_testing;

TEST(CudaParityTest, GemmAllTransposes) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  struct dims {
    int m, n, k;
  };
  for (dims d : {dims{37, 29, 53}, dims{1, 1, 1}, dims{128, 96, 200}}) {
    for (transpose ta : {transpose::no, transpose::yes}) {
      for (transpose tb : {transpose::no, transpose::yes}) {
        for (float beta : {0.0f, 0.5f}) {
          // Leading dimensions larger than the rows so that strides are exercised.
          const int lda = (ta == transpose::no ? d.k : d.m) + 3;
          const int ldb = (tb == transpose::no ? d.n : d.k) + 2;
          const int ldc = d.n + 4;
          const int rows_a = ta == transpose::no ? d.m : d.k;
          const int rows_b = tb == transpose::no ? d.k : d.n;
          const auto a = random_values(size_t(rows_a) * lda, 11);
          const auto b = random_values(size_t(rows_b) * ldb, 12);
          // With beta == 0, C must not be read: NaN there must not leak into the result.
          const auto c = beta == 0.0f ? std::vector<float>(size_t(d.m) * ldc, nan_value)
                                      : random_values(size_t(d.m) * ldc, 13);
          const auto op = [&](backend& device) {
            device_array<float> da(device, a), db(device, b), dc(device, c);
            device.gemm(device.default_stream(), ta, tb, d.m, d.n, d.k, 0.75f, da.data(), lda,
                        db.data(), ldb, beta, dc.data(), ldc);
            return outputs{dc.download()};
          };
          const std::string what = "gemm " + std::to_string(d.m) + "x" + std::to_string(d.n) + "x" +
                                   std::to_string(d.k) + " ta " + std::to_string(int(ta)) + " tb " +
                                   std::to_string(int(tb)) + " beta " + std::to_string(beta);
          expect_parity(pair, op, summed(d.k), what);
          std::vector<float> result = op(*pair.cuda)[0];
          for (int r = 0; r < d.m; ++r) {
            for (int col = 0; col < d.n; ++col) {
              ASSERT_FALSE(std::isnan(result[size_t(r) * ldc + col])) << what;
            }
          }
        }
      }
    }
  }
}

TEST(CudaParityTest, GemmEmptyInnerDimension) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const int m = 5, n = 4, ldc = 6;
  for (float beta : {0.0f, 2.0f}) {
    const auto c =
        beta == 0.0f ? std::vector<float>(m * ldc, nan_value) : random_values(m * ldc, 3);
    expect_parity(
        pair,
        [&](backend& device) {
          device_array<float> unused(device, 64), dc(device, c);
          device.gemm(device.default_stream(), transpose::no, transpose::no, m, n, 0, 1.0f,
                      unused.data(), 1, unused.data(), n, beta, dc.data(), ldc);
          return outputs{dc.download()};
        },
        exact, "gemm k=0 beta " + std::to_string(beta));
  }
}

/// |alpha| sum_k |a_ik b_kj| + |beta c_ij| for every element of a row-major C (stride ldc).
std::vector<double> gemm_magnitudes(transpose ta, transpose tb, int m, int n, int k, float alpha,
                                    const std::vector<float>& a, int lda,
                                    const std::vector<float>& b, int ldb, float beta,
                                    const std::vector<float>& c, int ldc) {
  std::vector<double> result(c.size(), 0.0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double total = 0;
      for (int p = 0; p < k; ++p) {
        const float av = ta == transpose::no ? a[size_t(i) * lda + p] : a[size_t(p) * lda + i];
        const float bv = tb == transpose::no ? b[size_t(p) * ldb + j] : b[size_t(j) * ldb + p];
        total += std::fabs(double(av) * bv);
      }
      result[size_t(i) * ldc + j] = std::fabs(alpha) * total + std::fabs(beta * c[i * ldc + j]);
    }
  }
  return result;
}

TEST(CudaParityTest, GemmAtReducedPrecision) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  // The CPU rounds both operands to nearest-even; cuBLAS's FAST_TF32 / FAST_16BF modes may
  // round differently (down, or ties away), by at most one unit of the kept bits, i.e. 2u. So
  // each product may differ by about 6u between the two (2u on the CPU, 4u on the GPU), and
  // the sums differ by fp32 reassociation besides. Tolerance: |cuda - cpu| <= (8u + 2k 2^-24)
  // (|alpha| sum |a b| + |beta c|): 2^-8 of that scale for tf32, 2^-5 for bf16.
  struct dims {
    int m, n, k;
  };
  for (math_precision precision : {math_precision::tf32, math_precision::bf16}) {
    const double u = unit_roundoff(precision);
    for (dims d : {dims{37, 29, 53}, dims{256, 192, 320}}) {
      for (transpose ta : {transpose::no, transpose::yes}) {
        for (transpose tb : {transpose::no, transpose::yes}) {
          const int lda = (ta == transpose::no ? d.k : d.m) + 3;
          const int ldb = (tb == transpose::no ? d.n : d.k) + 2;
          const int ldc = d.n + 4;
          const auto a = random_values(size_t(ta == transpose::no ? d.m : d.k) * lda, 41);
          const auto b = random_values(size_t(tb == transpose::no ? d.k : d.n) * ldb, 42);
          const auto c = random_values(size_t(d.m) * ldc, 43);
          const float alpha = 0.75f, beta = 0.5f;
          const auto op = [&](backend& device) {
            const stream s = device.create_stream();
            device.set_gemm_precision(s, precision);
            device_array<float> da(device, a), db(device, b), dc(device, c);
            device.gemm(s, ta, tb, d.m, d.n, d.k, alpha, da.data(), lda, db.data(), ldb, beta,
                        dc.data(), ldc);
            device.synchronize(s);
            device.destroy_stream(s);
            return dc.download();
          };
          const std::string what = std::string("gemm ") + to_string(precision) + " " +
                                   std::to_string(d.m) + "x" + std::to_string(d.n) + "x" +
                                   std::to_string(d.k) + " ta " + std::to_string(int(ta)) + " tb " +
                                   std::to_string(int(tb));
          const std::vector<float> expected = op(*pair.cpu);
          const std::vector<float> actual = op(*pair.cuda);
          const std::vector<double> scale =
              gemm_magnitudes(ta, tb, d.m, d.n, d.k, alpha, a, lda, b, ldb, beta, c, ldc);
          const double relative = 8 * u + 2.0 * d.k * std::ldexp(1.0, -24);
          size_t mismatches = 0;
          for (size_t i = 0; i < expected.size(); ++i) {
            const double difference = std::fabs(double(actual[i]) - expected[i]);
            if (!(difference <= relative * scale[i]) && ++mismatches <= 5) {
              ADD_FAILURE() << what << " [" << i << "]: cpu " << expected[i] << ", cuda "
                            << actual[i] << ", allowed " << relative * scale[i];
            }
          }
          EXPECT_EQ(mismatches, 0u) << what;
        }
      }
    }
  }
}

TEST(CudaParityTest, GemmBackAtFp32IsBitForBitTheDefault) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  backend& device = *pair.cuda;
  const int m = 96, n = 80, k = 112;
  const auto a = random_values(size_t(m) * k, 51), b = random_values(size_t(k) * n, 52);
  device_array<float> da(device, a), db(device, b), plain(device, m * n), reset(device, m * n),
      rounded(device, m * n);
  const stream s = device.create_stream();
  device.gemm(device.default_stream(), transpose::no, transpose::no, m, n, k, 1.0f, da.data(), k,
              db.data(), n, 0.0f, plain.data(), n);
  device.synchronize(device.default_stream());
  device.set_gemm_precision(s, math_precision::bf16);
  device.gemm(s, transpose::no, transpose::no, m, n, k, 1.0f, da.data(), k, db.data(), n, 0.0f,
              rounded.data(), n);
  device.set_gemm_precision(s, math_precision::fp32);
  device.gemm(s, transpose::no, transpose::no, m, n, k, 1.0f, da.data(), k, db.data(), n, 0.0f,
              reset.data(), n);
  device.synchronize(s);
  device.destroy_stream(s);
  EXPECT_EQ(reset.download(), plain.download());
  EXPECT_NE(rounded.download(), plain.download()) << "bf16 must round the operands";
}

TEST(CudaParityTest, RowAndChannelVectors) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const int rows = 67, cols = 130;
  const auto matrix = random_values(rows * cols, 21);
  const auto vector = random_values(cols, 22);
  expect_parity(
      pair,
      [&](backend& device) {
        device_array<float> dm(device, matrix), dv(device, vector);
        device.add_row_vector(device.default_stream(), dm.data(), dv.data(), rows, cols);
        return outputs{dm.download()};
      },
      exact, "add_row_vector");
  const int batch = 3, channels = 5, spatial = 49;
  const auto data = random_values(batch * channels * spatial, 23);
  const auto bias = random_values(channels, 24);
  expect_parity(
      pair,
      [&](backend& device) {
        device_array<float> dd(device, data), db(device, bias);
        device.add_channel_vector(device.default_stream(), dd.data(), db.data(), batch, channels,
                                  spatial);
        return outputs{dd.download()};
      },
      exact, "add_channel_vector");
}

TEST(CudaParityTest, SumRowsIsDeterministic) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  struct dims {
    int rows, cols;
  };
  for (dims d : {dims{67, 130}, dims{1000, 3}, dims{1, 40}, dims{0, 5}}) {
    for (float beta : {0.0f, 0.5f}) {
      const auto matrix = random_values(size_t(d.rows) * d.cols, 31);
      const auto out =
          beta == 0.0f ? std::vector<float>(d.cols, nan_value) : random_values(d.cols, 32);
      const auto op = [&](backend& device) {
        device_array<float> dm(device, matrix), dout(device, out);
        device.sum_rows(device.default_stream(), dm.data(), d.rows, d.cols, beta, dout.data());
        return outputs{dout.download()};
      };
      const std::string what = "sum_rows " + std::to_string(d.rows) + "x" + std::to_string(d.cols) +
                               " beta " + std::to_string(beta);
      expect_parity(pair, op, summed(d.rows), what);
      EXPECT_EQ(op(*pair.cuda), op(*pair.cuda)) << what;
    }
  }
}

TEST(CudaParityTest, SumChannelsIsDeterministic) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  struct dims {
    int batch, channels, spatial;
  };
  for (dims d : {dims{3, 5, 49}, dims{64, 16, 196}, dims{2, 3, 1}}) {
    for (float beta : {0.0f, 0.5f}) {
      const auto data = random_values(size_t(d.batch) * d.channels * d.spatial, 41);
      const auto out =
          beta == 0.0f ? std::vector<float>(d.channels, nan_value) : random_values(d.channels, 42);
      const auto op = [&](backend& device) {
        device_array<float> dd(device, data), dout(device, out);
        device.sum_channels(device.default_stream(), dd.data(), d.batch, d.channels, d.spatial,
                            beta, dout.data());
        return outputs{dout.download()};
      };
      const std::string what = "sum_channels " + std::to_string(d.batch) + "x" +
                               std::to_string(d.channels) + "x" + std::to_string(d.spatial);
      expect_parity(pair, op, summed(double(d.batch) * d.spatial), what);
      EXPECT_EQ(op(*pair.cuda), op(*pair.cuda)) << what;
    }
  }
}

TEST(CudaParityTest, TransposeBatched) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  struct dims {
    int batch, rows, cols;
  };
  for (dims d : {dims{3, 37, 45}, dims{2, 1, 100}, dims{1, 64, 64}, dims{5, 100, 1}}) {
    const auto in = random_values(size_t(d.batch) * d.rows * d.cols, 51);
    expect_parity(
        pair,
        [&](backend& device) {
          device_array<float> din(device, in), dout(device, in.size());
          device.transpose_batched(device.default_stream(), din.data(), dout.data(), d.batch,
                                   d.rows, d.cols);
          return outputs{dout.download()};
        },
        exact, "transpose_batched " + std::to_string(d.rows) + "x" + std::to_string(d.cols));
  }
}

TEST(CudaParityTest, CopyMatrix) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  // Columns [5, 5 + 30) of a 37 x 45 matrix into columns [2, 32) of a 37 x 40 one.
  const int rows = 37, cols = 30;
  const auto source = random_values(size_t(rows) * 45, 52);
  const auto target = random_values(size_t(rows) * 40, 53);
  expect_parity(
      pair,
      [&](backend& device) {
        device_array<float> from(device, source), to(device, target);
        device.copy_matrix(device.default_stream(), from.data() + 5, 45, to.data() + 2, 40, rows,
                           cols);
        return outputs{to.download()};
      },
      exact, "copy_matrix");
}

TEST(CudaParityTest, AxpyAndMultiply) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const size_t count = 100003;
  const auto x = random_values(count, 61);
  const auto y = random_values(count, 62);
  expect_parity(
      pair,
      [&](backend& device) {
        device_array<float> dx(device, x), dy(device, y);
        device.axpy(device.default_stream(), 0.3f, dx.data(), dy.data(), count);
        return outputs{dy.download()};
      },
      rounding, "axpy");
  expect_parity(
      pair,
      [&](backend& device) {
        device_array<float> dx(device, x), dy(device, y), dout(device, count);
        device.multiply(device.default_stream(), dx.data(), dy.data(), dout.data(), count);
        device.multiply(device.default_stream(), dx.data(), dy.data(), dx.data(), count);
        return outputs{dout.download(), dx.download()};
      },
      exact, "multiply");
}

TEST(CudaParityTest, SumIsDeterministic) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  for (size_t count :
       {size_t{0}, size_t{1}, size_t{1000}, size_t{2048}, size_t{2049}, size_t{(1 << 18) + 3}}) {
    const auto x = random_values(count, 71);
    const auto op = [&](backend& device) {
      device_array<float> dx(device, x), dout(device, 1);
      device.sum(device.default_stream(), dx.data(), count, dout.data());
      return outputs{dout.download()};
    };
    const std::string what = "sum " + std::to_string(count);
    expect_parity(pair, op, {1e-5, 1e-7 * double(count) + 1e-5}, what);
    EXPECT_EQ(op(*pair.cuda), op(*pair.cuda)) << what;
  }
}

TEST(CudaParityTest, Activations) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const size_t count = 10007;
  const auto x = random_values(count, 81, -4.0f, 4.0f);
  const auto dy = random_values(count, 82);
  for (activation f : {activation::relu, activation::tanh, activation::gelu}) {
    const tolerance t = f == activation::relu ? exact : rounding;
    const std::string what = "activation " + std::to_string(int(f));
    expect_parity(
        pair,
        [&](backend& device) {
          device_array<float> dx(device, x), dy_in(device, dy), y(device, count),
              grad(device, count);
          const stream s = device.default_stream();
          device.activation_forward(s, f, dx.data(), y.data(), count);
          device.activation_backward(s, f, dx.data(), y.data(), dy_in.data(), grad.data(), count);
          outputs result{y.download(), grad.download()};
          if (device.kind() != device_kind::cuda) return result;
          // In place (y over x, dx over dy) the kernels give the same bits.
          device.activation_backward(s, f, dx.data(), y.data(), dy_in.data(), dy_in.data(), count);
          device.activation_forward(s, f, dx.data(), dx.data(), count);
          EXPECT_EQ(dx.download(), result[0]);
          EXPECT_EQ(dy_in.download(), result[1]);
          return result;
        },
        t, what);
  }
}

TEST(CudaParityTest, SoftmaxCrossEntropyWithTies) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  struct dims {
    int rows, cols;
    bool ties;
  };
  for (dims d :
       {dims{67, 10, false}, dims{5, 1000, false}, dims{300, 33, true}, dims{1, 1, false}}) {
    const auto logits = d.ties ? tied_floats(size_t(d.rows) * d.cols, 91)
                               : random_values(size_t(d.rows) * d.cols, 91, -5.0f, 5.0f);
    const std::vector<int32_t> labels = labels_for(logits, d.rows, d.cols);
    for (bool with_gradient : {true, false}) {
      const auto op = [&](backend& device) {
        device_array<float> dl(device, logits), totals(device, 2), gradient(device, logits.size());
        device_array<int32_t> dlabels(device, labels);
        device.softmax_cross_entropy(
            device.default_stream(), dl.data(), dlabels.data(), d.rows, d.cols, 1.0f / d.rows,
            with_gradient ? gradient.data() : nullptr, totals.data(), totals.data() + 1);
        return outputs{totals.download(),
                       with_gradient ? gradient.download() : outputs::value_type{}};
      };
      const std::string what =
          "softmax_cross_entropy " + std::to_string(d.rows) + "x" + std::to_string(d.cols);
      const outputs expected = op(*pair.cpu);
      const outputs actual = op(*pair.cuda);
      EXPECT_NEAR(expected[0][0], actual[0][0], 1e-5 * d.rows + 1e-5 * std::fabs(expected[0][0]))
          << what << " loss";
      EXPECT_EQ(expected[0][1], actual[0][1]) << what << " correct";
      expect_close(expected[1], actual[1], {1e-5, 1e-7}, what + " gradient");
      EXPECT_EQ(op(*pair.cuda), actual) << what << " is not deterministic";
    }
  }
}

// Padded positions: rows labelled ignored_label give no loss, no hit and zero gradient rows on
// both backends.
TEST(CudaParityTest, SoftmaxCrossEntropyIgnoredLabels) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const int rows = 70, cols = 33;
  const auto logits = random_values(size_t(rows) * cols, 93, -5.0f, 5.0f);
  std::vector<int32_t> labels = labels_for(logits, rows, cols);
  for (int r = 0; r < rows; r += 3) labels[size_t(r)] = ignored_label;
  const auto op = [&](backend& device) {
    device_array<float> dl(device, logits), totals(device, 2), gradient(device, logits.size());
    device_array<int32_t> dlabels(device, labels);
    device.softmax_cross_entropy(device.default_stream(), dl.data(), dlabels.data(), rows, cols,
                                 1.0f / rows, gradient.data(), totals.data(), totals.data() + 1);
    return outputs{totals.download(), gradient.download()};
  };
  const outputs expected = op(*pair.cpu);
  const outputs actual = op(*pair.cuda);
  EXPECT_TRUE(std::isfinite(actual[0][0]));
  EXPECT_NEAR(expected[0][0], actual[0][0], 1e-5 * rows + 1e-5 * std::fabs(expected[0][0]));
  EXPECT_EQ(expected[0][1], actual[0][1]);
  expect_close(expected[1], actual[1], {1e-5, 1e-7}, "softmax_cross_entropy ignored labels");
  for (int r = 0; r < rows; r += 3) {
    for (int c = 0; c < cols; ++c) EXPECT_EQ(actual[1][size_t(r * cols + c)], 0.0f) << r;
  }
}

}  // namespace
}  // namespace troupe::layers
