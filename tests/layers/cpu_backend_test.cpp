#include "layers/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "layers/loss.h"
#include "layers/random.h"
#include "tests/layers/cpu_test_support.h"

namespace troupe::layers {
namespace {

using namespace cpu_testing;

TEST(CpuBackendTest, AllocatesAlignedMemoryAndCopies) {
  EXPECT_EQ(cpu().name(), "cpu");
  EXPECT_EQ(cpu().kind(), device_kind::cpu);
  EXPECT_NE(cpu().default_stream().handle, nullptr);
  for (size_t bytes : {0, 1, 63, 64, 1000}) {
    void* pointer = cpu().allocate(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pointer) % 64, 0u);
    cpu().deallocate(pointer);
  }
  floats a(std::vector<float>{1, 2, 3, 4});
  floats b(4);
  cpu().copy_device_to_device(s(), b.data(), a.data(), 4 * sizeof(float));
  EXPECT_EQ(b.host(), (std::vector<float>{1, 2, 3, 4}));
  cpu().fill(s(), b.data() + 1, 7.5f, 2);
  EXPECT_EQ(b.host(), (std::vector<float>{1, 7.5f, 7.5f, 4}));
}

TEST(CpuBackendTest, HostBuffersAreAlignedHostMemory) {
  for (size_t bytes : {0, 1, 4096, 100000}) {
    auto* pointer = static_cast<unsigned char*>(cpu().allocate_host(bytes));
    ASSERT_NE(pointer, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pointer) % 64, 0u);
    std::fill_n(pointer, bytes, 0xab);
    cpu().deallocate_host(pointer);
  }
  cpu().deallocate_host(nullptr);
}

/// C = alpha * op(A) * op(B) + beta * C with explicit strides, in double.
void naive_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float>& a,
                int lda, const std::vector<float>& b, int ldb, float beta, std::vector<float>& c,
                int ldc) {
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double total = 0.0;
      for (int p = 0; p < k; ++p) {
        const float av = ta ? a[size_t(p) * lda + i] : a[size_t(i) * lda + p];
        const float bv = tb ? b[size_t(j) * ldb + p] : b[size_t(p) * ldb + j];
        total += double(av) * bv;
      }
      float& out = c[size_t(i) * ldc + j];
      out = float(alpha * total + (beta == 0.0f ? 0.0 : double(beta) * out));
    }
  }
}

void check_gemm(bool ta, bool tb, int m, int n, int k, float beta, uint64_t seed) {
  const int lda = (ta ? m : k) + 3;
  const int ldb = (tb ? k : n) + 2;
  const int ldc = n + 4;
  const std::vector<float> a = random_values(size_t(ta ? k : m) * lda, seed);
  const std::vector<float> b = random_values(size_t(tb ? n : k) * ldb, seed + 1);
  std::vector<float> c = random_values(size_t(m) * ldc, seed + 2);
  if (beta == 0.0f) {
    for (int i = 0; i < m; ++i) std::fill_n(c.begin() + size_t(i) * ldc, n, nan_value);
  }
  floats da(a), db(b), dc(c);
  cpu().gemm(s(), ta ? transpose::yes : transpose::no, tb ? transpose::yes : transpose::no, m, n, k,
             1.5f, da.data(), lda, db.data(), ldb, beta, dc.data(), ldc);
  naive_gemm(ta, tb, m, n, k, 1.5f, a, lda, b, ldb, beta, c, ldc);
  const std::vector<float> actual = dc.host();
  for (size_t i = 0; i < c.size(); ++i) {
    ASSERT_NEAR(actual[i], c[i], 2e-6f * (k + 1)) << "ta=" << ta << " tb=" << tb << " i=" << i;
  }
}

TEST(CpuBackendTest, GemmTransposesMatchNaive) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check_gemm(ta, tb, 5, 7, 3, 0.5f, 11);
      check_gemm(ta, tb, 67, 45, 130, 1.0f, 12);
    }
  }
}

TEST(CpuBackendTest, GemmWithZeroBetaDoesNotReadOutput) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) check_gemm(ta, tb, 9, 13, 6, 0.0f, 21);
  }
  floats c(6, nan_value);
  cpu().gemm(s(), transpose::no, transpose::no, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.0f,
             c.data(), 3);
  EXPECT_EQ(c.host(), std::vector<float>(6, 0.0f));
}

TEST(CpuBackendTest, RowVectorOpsMatchNaive) {
  for (int cols : {5, 3000}) {
    const int rows = 7;
    const std::vector<float> matrix = random_values(size_t(rows) * cols, 31);
    const std::vector<float> vector = random_values(cols, 32);
    floats dm(matrix), dv(vector), out(cols, nan_value);
    cpu().sum_rows(s(), dm.data(), rows, cols, 0.0f, out.data());
    std::vector<float> expected(cols, 0.0f);
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) expected[c] += matrix[size_t(r) * cols + c];
    }
    expect_near_all(out.host(), expected, 1e-5f);
    cpu().sum_rows(s(), dm.data(), rows, cols, 0.5f, out.data());
    for (int c = 0; c < cols; ++c) expected[c] *= 1.5f;
    expect_near_all(out.host(), expected, 1e-5f);

    cpu().add_row_vector(s(), dm.data(), dv.data(), rows, cols);
    std::vector<float> added = matrix;
    for (size_t i = 0; i < added.size(); ++i) added[i] += vector[i % cols];
    EXPECT_EQ(dm.host(), added);
  }
}

TEST(CpuBackendTest, ChannelVectorOpsMatchNaive) {
  const int batch = 3, channels = 4, spatial = 37;
  const std::vector<float> data = random_values(size_t(batch) * channels * spatial, 41);
  const std::vector<float> vector = random_values(channels, 42);
  floats dd(data), dv(vector), out(channels, nan_value);
  std::vector<double> expected(channels, 0.0);
  for (size_t i = 0; i < data.size(); ++i) expected[(i / spatial) % channels] += data[i];
  cpu().sum_channels(s(), dd.data(), batch, channels, spatial, 0.0f, out.data());
  std::vector<float> expected_float(expected.begin(), expected.end());
  expect_near_all(out.host(), expected_float, 1e-5f);
  cpu().sum_channels(s(), dd.data(), batch, channels, spatial, 2.0f, out.data());
  for (float& v : expected_float) v *= 3.0f;
  expect_near_all(out.host(), expected_float, 1e-5f);

  cpu().add_channel_vector(s(), dd.data(), dv.data(), batch, channels, spatial);
  std::vector<float> added = data;
  for (size_t i = 0; i < added.size(); ++i) added[i] += vector[(i / spatial) % channels];
  EXPECT_EQ(dd.host(), added);
}

TEST(CpuBackendTest, CopyMatrixCopiesABlockOfColumnsAndNothingElse) {
  const int rows = 7;
  const std::vector<float> in = random_values(size_t(rows) * 9, 52);
  floats source(in), target(std::vector<float>(size_t(rows) * 6, -1.0f));
  // Columns [3, 7) of a 7 x 9 matrix into columns [1, 5) of a 7 x 6 one.
  cpu().copy_matrix(s(), source.data() + 3, 9, target.data() + 1, 6, rows, 4);
  const std::vector<float> out = target.host();
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < 6; ++c) {
      const float expected = c >= 1 && c < 5 ? in[size_t(r) * 9 + 3 + c - 1] : -1.0f;
      ASSERT_EQ(out[size_t(r) * 6 + c], expected) << r << " " << c;
    }
  }
}

TEST(CpuBackendTest, TransposeBatchedMatchesNaive) {
  const int batch = 3, rows = 37, cols = 45;
  const std::vector<float> in = random_values(size_t(batch) * rows * cols, 51);
  floats din(in), dout(in.size(), nan_value);
  cpu().transpose_batched(s(), din.data(), dout.data(), batch, rows, cols);
  const std::vector<float> out = dout.host();
  for (int b = 0; b < batch; ++b) {
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        ASSERT_EQ(out[(size_t(b) * cols + c) * rows + r], in[(size_t(b) * rows + r) * cols + c]);
      }
    }
  }
}

TEST(CpuBackendTest, ElementwiseOpsMatchNaive) {
  const size_t count = 1003;
  const std::vector<float> x = random_values(count, 61), y = random_values(count, 62);
  floats dx(x), dy(y), out(count);
  cpu().axpy(s(), 0.25f, dx.data(), dy.data(), count);
  std::vector<float> expected(count);
  for (size_t i = 0; i < count; ++i) expected[i] = y[i] + 0.25f * x[i];
  expect_near_all(dy.host(), expected, 1e-6f);

  cpu().multiply(s(), dx.data(), dy.data(), out.data(), count);
  for (size_t i = 0; i < count; ++i) expected[i] *= x[i];
  expect_near_all(out.host(), expected, 1e-6f);
  cpu().multiply(s(), dx.data(), out.data(), out.data(), count);  // out aliases b
  for (size_t i = 0; i < count; ++i) expected[i] *= x[i];
  expect_near_all(out.host(), expected, 1e-6f);
  cpu().multiply(s(), out.data(), dx.data(), out.data(), count);  // out aliases a
  for (size_t i = 0; i < count; ++i) expected[i] *= x[i];
  expect_near_all(out.host(), expected, 1e-6f);

  floats total(1, nan_value);
  cpu().sum(s(), dx.data(), count, total.data());
  double reference = 0.0;
  for (float v : x) reference += v;
  EXPECT_NEAR(total.host()[0], reference, 1e-4);
}

double activation_exact(activation f, double x) {
  switch (f) {
    case activation::relu:
      return x > 0 ? x : 0;
    case activation::tanh:
      return std::tanh(x);
    case activation::gelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  }
  return 0;
}

std::vector<float> activation_inputs() {
  std::vector<float> x = random_values(517, 71, -3.0f, 3.0f);
  // Zero, tanh's branch points (0.625 and 9) and saturation.
  for (float v : {0.0f, 0.625f, -0.625f, 0.6249f, 8.99f, -9.01f, -12.0f, 40.0f}) x.push_back(v);
  return x;
}

const activation all_activations[] = {activation::relu, activation::tanh, activation::gelu};

TEST(CpuBackendTest, ActivationsMatchFormulas) {
  const std::vector<float> x = activation_inputs();
  const size_t count = x.size();
  for (activation f : all_activations) {
    floats in(x), out(count, nan_value), in_place(x);
    cpu().activation_forward(s(), f, in.data(), out.data(), count);
    cpu().activation_forward(s(), f, in_place.data(), in_place.data(), count);
    std::vector<float> expected(count);
    for (size_t i = 0; i < count; ++i) expected[i] = float(activation_exact(f, x[i]));
    expect_near_all(out.host(), expected, 5e-7f);
    EXPECT_EQ(in_place.host(), out.host());
  }
  floats not_a_number(1, nan_value);
  cpu().activation_forward(s(), activation::tanh, not_a_number.data(), not_a_number.data(), 1);
  EXPECT_TRUE(std::isnan(not_a_number.host()[0]));
}

TEST(CpuBackendTest, ActivationGradientsMatchFiniteDifferences) {
  const std::vector<float> x = activation_inputs();
  const size_t count = x.size();
  const std::vector<float> dy = random_values(count, 72);
  for (activation f : all_activations) {
    floats in(x), out(count), gradient(dy), dx(count, nan_value);
    cpu().activation_forward(s(), f, in.data(), out.data(), count);
    cpu().activation_backward(s(), f, in.data(), out.data(), gradient.data(), dx.data(), count);
    std::vector<float> expected(count);
    const double h = 1e-5;
    for (size_t i = 0; i < count; ++i) {
      const double slope =
          (activation_exact(f, x[i] + h) - activation_exact(f, x[i] - h)) / (2 * h);
      expected[i] = std::fabs(x[i]) < h && f == activation::relu ? 0.0f : float(dy[i] * slope);
    }
    expect_near_all(dx.host(), expected, 1e-5f);
    // dx may alias dy.
    cpu().activation_backward(s(), f, in.data(), out.data(), gradient.data(), gradient.data(),
                              count);
    EXPECT_EQ(gradient.host(), dx.host());
  }
}

TEST(CpuBackendTest, SoftmaxCrossEntropyMatchesNaive) {
  const int rows = 6, cols = 5;
  std::vector<float> logits = random_values(size_t(rows) * cols, 81, -4.0f, 4.0f);
  logits[0] = logits[1] = 9.0f;                        // tie won by the label (column 0)
  logits[2 * cols + 1] = logits[2 * cols + 2] = 9.0f;  // tie lost by the label (column 2)
  for (int c = 0; c < cols; ++c) logits[cols + c] = 1000.0f + c;  // needs max subtraction
  const std::vector<int32_t> labels{0, 4, 2, 3, 1, 1};
  floats dl(logits), grad(logits.size(), nan_value), loss(1), correct(1);
  device_array<int32_t> dlabels(labels);
  const float scale = 0.5f;
  cpu().softmax_cross_entropy(s(), dl.data(), dlabels.data(), rows, cols, scale, grad.data(),
                              loss.data(), correct.data());
  double expected_loss = 0.0;
  int expected_correct = 0;
  std::vector<float> expected_grad(logits.size());
  for (int r = 0; r < rows; ++r) {
    const float* z = &logits[size_t(r) * cols];
    int best = 0;
    for (int c = 1; c < cols; ++c) best = z[c] > z[best] ? c : best;
    expected_correct += best == labels[r];
    double total = 0.0;
    for (int c = 0; c < cols; ++c) total += std::exp(double(z[c]) - z[best]);
    expected_loss += std::log(total) - (double(z[labels[r]]) - z[best]);
    for (int c = 0; c < cols; ++c) {
      const double p = std::exp(double(z[c]) - z[best]) / total;
      expected_grad[size_t(r) * cols + c] = float((p - (c == labels[r])) * scale);
    }
  }
  EXPECT_NEAR(loss.host()[0], expected_loss, 1e-4);
  EXPECT_EQ(correct.host()[0], float(expected_correct));
  for (int row : {0, 2}) {  // the ties alone: only the first maximal logit counts
    cpu().softmax_cross_entropy(s(), dl.data() + row * cols, dlabels.data() + row, 1, cols, scale,
                                nullptr, loss.data(), correct.data());
    EXPECT_EQ(correct.host()[0], row == 0 ? 1.0f : 0.0f);
  }
  expect_near_all(grad.host(), expected_grad, 1e-6f);

  cpu().softmax_cross_entropy(s(), dl.data(), dlabels.data(), rows, cols, scale, grad.data(),
                              loss.data(), correct.data());
  floats loss_only(1, nan_value);
  cpu().softmax_cross_entropy(s(), dl.data(), dlabels.data(), rows, cols, scale, nullptr,
                              loss_only.data(), correct.data());
  EXPECT_EQ(loss_only.host()[0], loss.host()[0]);
}

// A row labelled ignored_label (a padded position) adds no loss, no hit and no gradient: the
// whole call gives what the scored rows give alone.
TEST(CpuBackendTest, SoftmaxCrossEntropySkipsIgnoredLabels) {
  const int rows = 5, cols = 4;
  const std::vector<float> logits = random_values(size_t(rows) * cols, 83, -3.0f, 3.0f);
  const std::vector<int32_t> labels{2, ignored_label, 0, ignored_label, 3};
  const std::vector<int> scored{0, 2, 4};
  floats dl(logits), grad(logits.size(), nan_value), loss(1), correct(1);
  device_array<int32_t> dlabels(labels);
  cpu().softmax_cross_entropy(s(), dl.data(), dlabels.data(), rows, cols, 0.25f, grad.data(),
                              loss.data(), correct.data());
  std::vector<float> kept_logits;
  std::vector<int32_t> kept_labels;
  for (int row : scored) {
    kept_logits.insert(kept_logits.end(), logits.begin() + row * cols,
                       logits.begin() + (row + 1) * cols);
    kept_labels.push_back(labels[size_t(row)]);
  }
  floats kl(kept_logits), kept_grad(kept_logits.size()), kept_loss(1), kept_correct(1);
  device_array<int32_t> kept(kept_labels);
  cpu().softmax_cross_entropy(s(), kl.data(), kept.data(), 3, cols, 0.25f, kept_grad.data(),
                              kept_loss.data(), kept_correct.data());
  EXPECT_GT(kept_loss.host()[0], 0.0f);
  EXPECT_EQ(loss.host()[0], kept_loss.host()[0]);
  EXPECT_EQ(correct.host()[0], kept_correct.host()[0]);
  const std::vector<float> gradient = grad.host(), expected = kept_grad.host();
  for (int row = 0; row < rows; ++row) {
    const auto found = std::find(scored.begin(), scored.end(), row);
    for (int c = 0; c < cols; ++c) {
      const float value = gradient[size_t(row * cols + c)];
      if (found == scored.end()) {
        EXPECT_EQ(value, 0.0f) << "ignored row " << row;
      } else {
        EXPECT_EQ(value, expected[size_t((found - scored.begin()) * cols + c)]) << "row " << row;
      }
    }
  }
}

TEST(CpuBackendTest, CountedLabelsLeaveOutIgnoredOnes) {
  EXPECT_EQ(counted_labels({3, ignored_label, 0, ignored_label}), 2);
  EXPECT_EQ(counted_labels({}), 0);
}

}  // namespace
}  // namespace troupe::layers
