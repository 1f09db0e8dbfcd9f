#pragma once

// Finite-difference checks of a layer's gradients on the CPU backend: the objective
// sum(r * layer(x)) for fixed upstream weights r, its analytic gradients from backward(), and
// central differences of it (steps of 1e-2) in each input element and weight.

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "layers/layer.h"
#include "tests/support/test_helpers.h"

namespace troupe::testing {

class gradient_checker {
 public:
  /// `input` is a batch of samples of shape `sample`. Analytic and numeric gradients may differ
  /// by `tolerance` + 1e-2 × |numeric|. `recompute` runs the layer as parallelism.recompute does.
  gradient_checker(const layers::layer_spec& spec, const layers::shape& sample,
                   std::vector<float> input, double tolerance = 2e-3, bool recompute = false)
      : device_(cpu_backend()),
        stream_(device_->default_stream()),
        values_(std::move(input)),
        tolerance_(tolerance) {
    layer_ = layers::make_layer(*device_, stream_, spec, sample, 99, 4);
    layers::shape dims{static_cast<int64_t>(values_.size()) / layers::element_count(sample)};
    dims.insert(dims.end(), sample.begin(), sample.end());
    input_ = layers::tensor::from_host(*device_, stream_, dims, values_);
    options_ = layers::run_options{stream_, layers::pass_mode::training, 1234, 0, recompute};
    auto result = layer_->forward(options_, input_);
    upstream_ = random_values(result.output.size(), 6);
    output_dims_ = result.output.dims();
  }

  double objective() {
    const std::vector<float> out = layer_->forward(options_, input_).output.to_host(stream_);
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += static_cast<double>(out[i]) * upstream_[i];
    return sum;
  }

  /// Runs backward once; returns the input gradient and records the parameter gradients.
  std::vector<float> analytic_input_gradient() {
    auto result = layer_->forward(options_, input_);
    auto upstream = layers::tensor::from_host(*device_, stream_, output_dims_, upstream_);
    for (layers::parameter* p : layer_->parameters()) p->has_gradient = false;
    return layer_->backward(options_, *result.context, upstream, true).to_host(stream_);
  }

  /// Central difference of the objective in element i of `values` (stored in t).
  double numeric(layers::tensor& t, std::vector<float>& values, size_t i) {
    const float saved = values[i];
    const float step = 1e-2f;
    values[i] = saved + step;
    t = layers::tensor::from_host(*device_, stream_, t.dims(), values);
    const double plus = objective();
    values[i] = saved - step;
    t = layers::tensor::from_host(*device_, stream_, t.dims(), values);
    const double minus = objective();
    values[i] = saved;
    t = layers::tensor::from_host(*device_, stream_, t.dims(), values);
    return (plus - minus) / (2.0 * step);
  }

  void check_input_gradient() {
    const std::vector<float> analytic = analytic_input_gradient();
    ASSERT_EQ(analytic.size(), values_.size());
    for (size_t i = 0; i < analytic.size(); ++i) {
      const double expected = numeric(input_, values_, i);
      EXPECT_NEAR(analytic[i], expected, tolerance_ + 1e-2 * std::fabs(expected))
          << layer_->type() << " input element " << i;
    }
  }

  /// Checks every `stride`-th element of every parameter.
  void check_parameter_gradients(size_t stride = 1) {
    analytic_input_gradient();
    for (layers::parameter* p : layer_->parameters()) {
      const std::vector<float> analytic = p->gradient.to_host(stream_);
      std::vector<float> values = p->value.to_host(stream_);
      for (size_t i = 0; i < values.size(); i += stride) {
        const double expected = numeric(p->value, values, i);
        EXPECT_NEAR(analytic[i], expected, tolerance_ + 1e-2 * std::fabs(expected))
            << layer_->type() << " " << p->name << " element " << i;
      }
    }
  }

  /// Runs every later pass on the packed sequences `segments` (run_options::segments).
  void set_segments(std::vector<int64_t> segments) {
    options_.segments = std::make_shared<const std::vector<int64_t>>(std::move(segments));
  }

  layers::layer& subject() { return *layer_; }

 private:
  std::unique_ptr<layers::backend> device_;
  layers::stream stream_;
  std::unique_ptr<layers::layer> layer_;
  std::vector<float> values_;
  double tolerance_;
  layers::tensor input_;
  layers::run_options options_;
  std::vector<float> upstream_;
  layers::shape output_dims_;
};

}  // namespace troupe::testing
