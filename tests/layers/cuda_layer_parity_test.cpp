// Parity of the CUDA backend's convolution columns, pooling, dropout and optimizer steps with the
// CPU reference, as in cuda_parity_test.cpp; every test skips itself when no CUDA device is
// present.

#include "tests/layers/cuda_test_support.h"

namespace troupe::layers {
namespace {

using namespace cuda_testing;

TEST(CudaParityTest, Im2colAndCol2im) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  for (const convolution_geometry& g :
       {make_convolution(2, 3, 7, 6, 3, 1, 1), make_convolution(2, 2, 9, 9, 3, 2, 0),
        make_convolution(1, 4, 8, 7, 5, 2, 2), make_convolution(3, 1, 5, 5, 1, 1, 0),
        make_convolution(1, 2, 6, 6, 2, 3, 1)}) {
    const size_t image_size = size_t(g.batch) * g.channels * g.height * g.width;
    const size_t columns_size =
        size_t(g.batch) * g.out_height * g.out_width * g.channels * g.kernel * g.kernel;
    const auto image = random_values(image_size, 101);
    const auto columns = random_values(columns_size, 102);
    const std::string what = "k" + std::to_string(g.kernel) + " s" + std::to_string(g.stride) +
                             " p" + std::to_string(g.padding);
    expect_parity(
        pair,
        [&](backend& device) {
          device_array<float> di(device, image);
          device_array<float> dc(device, std::vector<float>(columns_size, nan_value));
          device.im2col(device.default_stream(), g, di.data(), dc.data());
          return outputs{dc.download()};
        },
        exact, "im2col " + what);
    // col2im overwrites the image: NaN there must not survive.
    const auto op = [&](backend& device) {
      device_array<float> dc(device, columns);
      device_array<float> di(device, std::vector<float>(image_size, nan_value));
      device.col2im(device.default_stream(), g, dc.data(), di.data());
      return outputs{di.download()};
    };
    expect_parity(pair, op, summed(g.kernel * g.kernel), "col2im " + what);
    EXPECT_FALSE(has_nan(op(*pair.cuda)[0])) << "col2im " << what;
  }
}

TEST(CudaParityTest, MaxPoolForwardAndBackward) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  for (const pooling_geometry& g :
       {make_pooling(2, 3, 8, 8, 2, 2), make_pooling(2, 2, 9, 7, 3, 2),
        make_pooling(1, 2, 7, 7, 3, 1), make_pooling(1, 1, 5, 5, 2, 3)}) {
    const size_t in_size = size_t(g.batch) * g.channels * g.height * g.width;
    const size_t out_size = size_t(g.batch) * g.channels * g.out_height * g.out_width;
    const auto x = tied_floats(in_size, 111);
    const auto dy = random_values(out_size, 112);
    const std::string what = "k" + std::to_string(g.kernel) + " s" + std::to_string(g.stride);
    // Overlapping windows add several gradients into one pixel; the order may differ.
    const tolerance t = g.stride < g.kernel ? tolerance{1e-6, 1e-7} : exact;
    expect_parity(
        pair,
        [&](backend& device) {
          device_array<float> dx_in(device, x), y(device, out_size), ddy(device, dy);
          device_array<int32_t> argmax(device, out_size);
          device_array<float> dx(device, std::vector<float>(in_size, nan_value));
          const stream s = device.default_stream();
          device.max_pool_forward(s, g, dx_in.data(), y.data(), argmax.data());
          device.max_pool_backward(s, g, ddy.data(), argmax.data(), dx.data());
          return outputs{y.download(), as_floats(argmax.download()), dx.download()};
        },
        t, "max_pool " + what);
  }
}

TEST(CudaParityTest, DropoutMasksMatchBitForBit) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const size_t count = 10007;
  const uint64_t seed = 1234, offset = 77;
  const auto x = random_values(count, 121);
  for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
    const auto op = [&](backend& device) {
      device_array<float> dx(device, x), y(device, count), mask(device, count);
      device.dropout_forward(device.default_stream(), dx.data(), y.data(), mask.data(), count, p,
                             seed, offset);
      return outputs{y.download(), mask.download()};
    };
    const std::string what = "dropout " + std::to_string(p);
    expect_parity(pair, op, exact, what);
    const outputs result = op(*pair.cuda);
    const float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(result[1][i], dropout_keep(seed, offset + i, p) ? scale : 0.0f) << what << " " << i;
    }
  }
  // A batch split in two with matching offsets draws the same mask as the whole, in place.
  device_array<float> whole(*pair.cuda, x), split(*pair.cuda, x), mask(*pair.cuda, count);
  device_array<float> split_mask(*pair.cuda, count);
  const stream s = pair.cuda->default_stream();
  pair.cuda->dropout_forward(s, whole.data(), whole.data(), mask.data(), count, 0.3f, seed, 0);
  pair.cuda->dropout_forward(s, split.data(), split.data(), split_mask.data(), 400, 0.3f, seed, 0);
  pair.cuda->dropout_forward(s, split.data() + 400, split.data() + 400, split_mask.data() + 400,
                             count - 400, 0.3f, seed, 400);
  EXPECT_EQ(whole.download(), split.download());
  EXPECT_EQ(mask.download(), split_mask.download());
}

TEST(CudaParityTest, SgdSteps) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const size_t count = 5003;
  const auto weights = random_values(count, 131);
  sgd_parameters plain;
  plain.learning_rate = 0.1f;
  sgd_parameters momentum;
  momentum.learning_rate = 0.05f;
  momentum.momentum = 0.9f;
  momentum.weight_decay = 1e-3f;
  momentum.gradient_scale = 0.5f;
  sgd_parameters nesterov = momentum;
  nesterov.nesterov = true;
  for (const sgd_parameters& p : {plain, momentum, nesterov}) {
    expect_parity(
        pair,
        [&](backend& device) {
          device_array<float> w(device, weights), g(device, count);
          device_array<float> v(device, std::vector<float>(count, 0.0f));
          for (uint64_t step = 0; step < 3; ++step) {
            g.upload(random_values(count, 140 + step));
            device.sgd_step(device.default_stream(), w.data(), g.data(),
                            p.momentum == 0.0f ? nullptr : v.data(), count, p);
          }
          return outputs{w.download(), v.download()};
        },
        rounding, "sgd momentum " + std::to_string(p.momentum) + (p.nesterov ? " nesterov" : ""));
  }
}

TEST(CudaParityTest, AdamSteps) {
  if (troupe::layers::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TROUPE_REQUIRE_CUDA(pair);
  const size_t count = 5003;
  const auto weights = random_values(count, 151);
  adam_parameters p;
  p.learning_rate = 1e-3f;
  p.weight_decay = 0.01f;
  p.gradient_scale = 0.25f;
  // Five steps from the same weights, Adam's or NAdam's, on gradients drawn from `seed` on.
  const auto steps = [&](bool nesterov, uint64_t seed) {
    return [&, nesterov, seed](backend& device) {
      device_array<float> w(device, weights), g(device, count);
      device_array<float> m(device, std::vector<float>(count, 0.0f));
      device_array<float> v(device, std::vector<float>(count, 0.0f));
      adam_parameters step = p;
      step.nesterov = nesterov;
      step.momentum_product = 1;
      for (step.step = 1; step.step <= 5; ++step.step) {
        if (nesterov) {
          // A β1 that changes from step to step, as the delay-corrected Nesterov method's.
          step.beta1 = 0.9f + 0.01f * static_cast<float>(step.step % 3);
          step.momentum_product *= step.beta1;
        }
        g.upload(random_values(count, seed + step.step));
        device.adam_step(device.default_stream(), w.data(), g.data(), m.data(), v.data(), count,
                         step);
      }
      return outputs{w.download(), m.download(), v.download()};
    };
  };
  expect_parity(pair, steps(false, 160), {1e-5, 1e-7}, "adam");
  expect_parity(pair, steps(true, 170), {1e-5, 1e-7}, "nadam");
}

}  // namespace
}  // namespace troupe::layers
