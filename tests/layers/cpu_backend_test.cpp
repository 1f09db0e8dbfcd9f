#include "layers/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "layers/random.h"

namespace troupe::layers {
namespace {

const float nan_value = std::numeric_limits<float>::quiet_NaN();

backend& cpu() {
  static std::unique_ptr<backend> device = make_cpu_backend(1);
  return *device;
}

/// Device memory holding a copy of host values, freed on destruction.
template <typename T>
class device_array {
 public:
  explicit device_array(const std::vector<T>& values)
      : size_(values.size()), data_(static_cast<T*>(cpu().allocate(size_ * sizeof(T)))) {
    cpu().copy_host_to_device(cpu().default_stream(), data_, values.data(), size_ * sizeof(T));
  }
  explicit device_array(size_t size, T value = T()) : device_array(std::vector<T>(size, value)) {}
  ~device_array() { cpu().deallocate(data_); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;

  T* data() const { return data_; }
  std::vector<T> host() const {
    std::vector<T> values(size_);
    cpu().copy_device_to_host(cpu().default_stream(), values.data(), data_, size_ * sizeof(T));
    cpu().synchronize(cpu().default_stream());
    return values;
  }

 private:
  size_t size_;
  T* data_;
};

using floats = device_array<float>;

std::vector<float> random_values(size_t count, uint64_t seed, float low = -1.0f,
                                 float high = 1.0f) {
  random_generator generator(seed);
  std::vector<float> values(count);
  for (float& v : values) v = generator.uniform(low, high);
  return values;
}

void expect_near_all(const std::vector<float>& actual, const std::vector<float>& expected,
                     float tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], tolerance * (1.0f + std::fabs(expected[i])))
        << "at index " << i;
  }
}

stream s() { return cpu().default_stream(); }

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

convolution_geometry make_geometry(int channels, int size, int kernel, int stride, int padding) {
  convolution_geometry g;
  g.batch = 2;
  g.channels = channels;
  g.height = size;
  g.width = size + 1;
  g.kernel = kernel;
  g.stride = stride;
  g.padding = padding;
  g.out_height = (g.height + 2 * padding - kernel) / stride + 1;
  g.out_width = (g.width + 2 * padding - kernel) / stride + 1;
  return g;
}

std::vector<float> naive_im2col(const convolution_geometry& g, const std::vector<float>& image) {
  const int k = g.kernel;
  std::vector<float> columns(size_t(g.batch) * g.out_height * g.out_width * g.channels * k * k);
  for (int n = 0; n < g.batch; ++n)
    for (int y = 0; y < g.out_height; ++y)
      for (int x = 0; x < g.out_width; ++x)
        for (int c = 0; c < g.channels; ++c)
          for (int i = 0; i < k; ++i)
            for (int j = 0; j < k; ++j) {
              const int iy = y * g.stride - g.padding + i, ix = x * g.stride - g.padding + j;
              const bool inside = iy >= 0 && iy < g.height && ix >= 0 && ix < g.width;
              const size_t row = (size_t(n) * g.out_height + y) * g.out_width + x;
              columns[row * g.channels * k * k + (c * k + i) * k + j] =
                  inside ? image[((size_t(n) * g.channels + c) * g.height + iy) * g.width + ix]
                         : 0.0f;
            }
  return columns;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double total = 0.0;
  for (size_t i = 0; i < a.size(); ++i) total += double(a[i]) * b[i];
  return total;
}

TEST(CpuBackendTest, Im2colMatchesNaiveAndCol2imIsItsAdjoint) {
  const std::vector<convolution_geometry> geometries{
      make_geometry(3, 6, 3, 1, 1), make_geometry(2, 7, 3, 2, 0), make_geometry(2, 8, 5, 1, 2),
      make_geometry(1, 9, 2, 2, 0), make_geometry(2, 6, 4, 3, 2), make_geometry(4, 5, 1, 1, 0),
      make_geometry(1, 3, 5, 1, 3)};
  uint64_t seed = 91;
  for (const convolution_geometry& g : geometries) {
    const size_t image_size = size_t(g.batch) * g.channels * g.height * g.width;
    const size_t columns_size =
        size_t(g.batch) * g.out_height * g.out_width * g.channels * g.kernel * g.kernel;
    const std::vector<float> image = random_values(image_size, ++seed);
    const std::vector<float> columns = random_values(columns_size, ++seed);
    floats dimage(image), dcolumns(columns_size, nan_value);
    cpu().im2col(s(), g, dimage.data(), dcolumns.data());
    const std::vector<float> gathered = dcolumns.host();
    EXPECT_EQ(gathered, naive_im2col(g, image)) << "kernel " << g.kernel;

    floats dc(columns), back(image_size, nan_value);  // col2im overwrites, never reads
    cpu().col2im(s(), g, dc.data(), back.data());
    const double lhs = dot(gathered, columns);
    const double rhs = dot(image, back.host());
    EXPECT_NEAR(lhs, rhs, 1e-4 * (1.0 + std::fabs(lhs))) << "kernel " << g.kernel;
  }
}

pooling_geometry make_pooling(int height, int width, int kernel, int stride) {
  pooling_geometry g;
  g.batch = 2;
  g.channels = 3;
  g.height = height;
  g.width = width;
  g.kernel = kernel;
  g.stride = stride;
  g.out_height = (height - kernel) / stride + 1;
  g.out_width = (width - kernel) / stride + 1;
  return g;
}

/// Index within its plane of the first maximal input of one window, by the contract.
int naive_window_argmax(const pooling_geometry& g, const float* plane, int oy, int ox) {
  int best = -1;
  for (int i = 0; i < g.kernel; ++i) {
    for (int j = 0; j < g.kernel; ++j) {
      const int index = (oy * g.stride + i) * g.width + ox * g.stride + j;
      if (best < 0 || plane[index] > plane[best]) best = index;
    }
  }
  return best;
}

void check_max_pool(const pooling_geometry& g, uint64_t seed) {
  const size_t plane = size_t(g.height) * g.width, planes = size_t(g.batch) * g.channels;
  const size_t out_plane = size_t(g.out_height) * g.out_width;
  std::vector<float> x = random_values(planes * plane, seed);
  for (float& v : x) v = std::round(v * 2.0f);  // many ties
  const std::vector<float> dy = random_values(planes * out_plane, seed + 1);
  floats dx(x), y(planes * out_plane, nan_value), ddy(dy), grad(x.size(), nan_value);
  device_array<int32_t> argmax(planes * out_plane, -1);
  cpu().max_pool_forward(s(), g, dx.data(), y.data(), argmax.data());
  cpu().max_pool_backward(s(), g, ddy.data(), argmax.data(), grad.data());
  const std::vector<float> pooled = y.host();
  const std::vector<int32_t> indices = argmax.host();
  std::vector<float> expected_grad(x.size(), 0.0f);
  for (size_t p = 0; p < planes; ++p) {
    for (int oy = 0; oy < g.out_height; ++oy) {
      for (int ox = 0; ox < g.out_width; ++ox) {
        const int best = naive_window_argmax(g, &x[p * plane], oy, ox);
        const size_t o = p * out_plane + size_t(oy) * g.out_width + ox;
        ASSERT_EQ(indices[o], best) << "window " << o;
        ASSERT_EQ(pooled[o], x[p * plane + best]);
        expected_grad[p * plane + best] += dy[o];
      }
    }
  }
  EXPECT_EQ(grad.host(), expected_grad);
}

TEST(CpuBackendTest, MaxPoolPicksFirstMaximumAndRoutesGradient) {
  check_max_pool(make_pooling(5, 6, 2, 2), 101);  // the last row is left out
  check_max_pool(make_pooling(7, 8, 3, 2), 103);  // overlapping windows share inputs
  check_max_pool(make_pooling(4, 4, 2, 1), 105);
}

TEST(CpuBackendTest, DropoutMaskIsReproducibleAndSplitConsistent) {
  const size_t count = 1000;
  const float p = 0.3f;
  const std::vector<float> x = random_values(count, 111);
  floats dx(x), y(count), mask(count), y2(count), mask2(count);
  cpu().dropout_forward(s(), dx.data(), y.data(), mask.data(), count, p, 42, 7);
  const std::vector<float> whole_mask = mask.host(), whole_y = y.host();
  int kept = 0;
  for (size_t i = 0; i < count; ++i) {
    const float expected = dropout_keep(42, 7 + i, p) ? 1.0f / (1.0f - p) : 0.0f;
    ASSERT_EQ(whole_mask[i], expected);
    ASSERT_EQ(whole_y[i], x[i] * expected);
    kept += expected != 0.0f;
  }
  EXPECT_NEAR(kept / double(count), 1.0 - p, 0.05);

  cpu().dropout_forward(s(), dx.data(), y2.data(), mask2.data(), count, p, 42, 7);
  EXPECT_EQ(mask2.host(), whole_mask);
  const size_t half = 389;
  cpu().dropout_forward(s(), dx.data(), y2.data(), mask2.data(), half, p, 42, 7);
  cpu().dropout_forward(s(), dx.data() + half, y2.data() + half, mask2.data() + half, count - half,
                        p, 42, 7 + half);
  EXPECT_EQ(mask2.host(), whole_mask);
  EXPECT_EQ(y2.host(), whole_y);
  cpu().dropout_forward(s(), dx.data(), y2.data(), mask2.data(), count, p, 43, 7);
  EXPECT_NE(mask2.host(), whole_mask);

  cpu().dropout_forward(s(), dx.data(), y2.data(), mask2.data(), count, 0.0f, 42, 7);
  EXPECT_EQ(mask2.host(), std::vector<float>(count, 1.0f));
  EXPECT_EQ(y2.host(), x);
  cpu().dropout_forward(s(), dx.data(), y2.data(), mask2.data(), count, 1.0f, 42, 7);
  EXPECT_EQ(mask2.host(), std::vector<float>(count, 0.0f));
  EXPECT_EQ(y2.host(), std::vector<float>(count, 0.0f));
}

TEST(CpuBackendTest, SgdStepMatchesHandLoop) {
  const size_t count = 77;
  for (float momentum : {0.0f, 0.9f}) {
    sgd_parameters p;
    p.learning_rate = 0.1f;
    p.momentum = momentum;
    p.weight_decay = 0.01f;
    p.gradient_scale = 0.5f;
    std::vector<float> w = random_values(count, 121), v(count, 0.0f);
    floats dw(w), dv(count, 0.0f);
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> grad = random_values(count, 122 + step);
      floats dg(grad);
      cpu().sgd_step(s(), dw.data(), dg.data(), momentum == 0.0f ? nullptr : dv.data(), count, p);
      for (size_t i = 0; i < count; ++i) {
        const float g = p.gradient_scale * grad[i] + p.weight_decay * w[i];
        v[i] = momentum == 0.0f ? g : momentum * v[i] + g;
        w[i] -= p.learning_rate * v[i];
      }
    }
    expect_near_all(dw.host(), w, 1e-6f);
    if (momentum != 0.0f) expect_near_all(dv.host(), v, 1e-6f);
  }
}

TEST(CpuBackendTest, AdamStepMatchesHandLoop) {
  const size_t count = 77;
  adam_parameters p;
  p.learning_rate = 0.01f;
  p.weight_decay = 0.02f;
  p.gradient_scale = 2.0f;
  std::vector<double> w, m(count, 0.0), v(count, 0.0);
  const std::vector<float> initial = random_values(count, 131);
  w.assign(initial.begin(), initial.end());
  floats dw(initial), dm(count, 0.0f), dv(count, 0.0f);
  for (int step = 1; step <= 4; ++step) {
    p.step = step;
    const std::vector<float> grad = random_values(count, 132 + step);
    floats dg(grad);
    cpu().adam_step(s(), dw.data(), dg.data(), dm.data(), dv.data(), count, p);
    for (size_t i = 0; i < count; ++i) {
      const double g = double(p.gradient_scale) * grad[i] + double(p.weight_decay) * w[i];
      m[i] = p.beta1 * m[i] + (1 - double(p.beta1)) * g;
      v[i] = p.beta2 * v[i] + (1 - double(p.beta2)) * g * g;
      const double m_hat = m[i] / (1 - std::pow(double(p.beta1), step));
      const double v_hat = v[i] / (1 - std::pow(double(p.beta2), step));
      w[i] -= p.learning_rate * m_hat / (std::sqrt(v_hat) + p.epsilon);
    }
  }
  expect_near_all(dw.host(), std::vector<float>(w.begin(), w.end()), 1e-5f);
  expect_near_all(dm.host(), std::vector<float>(m.begin(), m.end()), 1e-5f);
  expect_near_all(dv.host(), std::vector<float>(v.begin(), v.end()), 1e-5f);
}

}  // namespace
}  // namespace troupe::layers
