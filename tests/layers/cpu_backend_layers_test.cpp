// The CPU backend's convolution columns, pooling, dropout and optimizer steps against naive
// loops.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "layers/cpu/cpu_backend.h"
#include "layers/random.h"
#include "tests/layers/cpu_test_support.h"

namespace troupe::layers {
namespace {

using namespace cpu_testing;

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
